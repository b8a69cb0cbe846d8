// The remote tier's configuration and value format, without a server: URL parsing, the
// KILN_REMOTE_CACHE* variables, signing and verifying values.
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <string>

#include "kiln/cache/redis_client.h"
#include "kiln/cache/remote_value.h"
#include "kiln/jit/error.h"
#include "kiln/runtime/config.h"

using Catch::Matchers::Contains;
using kiln::CacheEntry;
using kiln::CacheKey;
using kiln::ErrorCode;

namespace {

std::string error_of(const std::function<void()>& fn, ErrorCode code) {
  try {
    fn();
  } catch (const kiln::Error& e) {
    CHECK(e.code() == code);
    return e.what();
  }
  FAIL("no kiln::Error thrown");
  return "";
}

// Sets environment variables for one scope.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const auto& [k, v] : vars) {
      names_.push_back(k);
      ::setenv(k, v, 1);
    }
  }
  ~ScopedEnv() {
    for (const char* k : names_) ::unsetenv(k);
  }

 private:
  std::vector<const char*> names_;
};

CacheEntry entry_for(const CacheKey& key) {
  CacheEntry e;
  e.key = key;
  e.semantic_key = "test/sm_90a/x";
  e.metadata = {{"arch", "sm_90a"}};
  e.cubin = std::string(300, '\x42');
  return e;
}

}  // namespace

TEST_CASE("remote config: redis URLs parse into endpoints, bad ones say what is wrong", "[unit]") {
  auto e = kiln::parse_redis_url("redis://cache.internal:6380/3");
  CHECK(e.host == "cache.internal");
  CHECK(e.port == 6380);
  CHECK(e.db == 3);
  CHECK(e.user.empty());
  CHECK(e.password.empty());
  e = kiln::parse_redis_url("redis://kiln:p%40ss%3Aw@10.0.0.5:7000");
  CHECK(e.user == "kiln");
  CHECK(e.password == "p@ss:w");
  CHECK(e.host == "10.0.0.5");
  CHECK(e.db == 0);
  e = kiln::parse_redis_url("redis://:only-password@host");
  CHECK(e.user.empty());
  CHECK(e.password == "only-password");
  CHECK(e.port == 6379);
  e = kiln::parse_redis_url("redis://[::1]:6390/");
  CHECK(e.host == "::1");
  CHECK(e.port == 6390);
  CHECK(e.describe() == "redis://::1:6390/0");

  CHECK_THAT(error_of([] { kiln::parse_redis_url("rediss://h:1"); }, ErrorCode::kInvalidArgument),
             Contains("redis://"));
  CHECK_THAT(error_of([] { kiln::parse_redis_url("redis://h:99999"); }, ErrorCode::kInvalidArgument),
             Contains("port '99999'"));
  CHECK_THAT(error_of([] { kiln::parse_redis_url("redis://h:1/x"); }, ErrorCode::kInvalidArgument),
             Contains("database number 'x'"));
  CHECK_THAT(error_of([] { kiln::parse_redis_url("redis://:1"); }, ErrorCode::kInvalidArgument), Contains("host is empty"));
  CHECK_THAT(error_of([] { kiln::parse_redis_url("redis://u:%zz@h"); }, ErrorCode::kInvalidArgument),
             Contains("password"));
}

TEST_CASE("remote config: KILN_REMOTE_CACHE and its companions are read in one place", "[unit]") {
  {
    ScopedEnv env{{"KILN_REMOTE_CACHE", ""}};
    CHECK_FALSE(kiln::Config::from_environment().remote.has_value());
  }
  {
    ScopedEnv env{{"KILN_REMOTE_CACHE", "redis://kiln@127.0.0.1:6400/2"},
                  {"KILN_REMOTE_CACHE_PASSWORD", "from-env"},
                  {"KILN_REMOTE_CACHE_PREFIX", "fleet-a:"},
                  {"KILN_REMOTE_CACHE_SECRET", "hmac key"},
                  {"KILN_REMOTE_CACHE_CONNECT_TIMEOUT_MS", "150"},
                  {"KILN_REMOTE_CACHE_TIMEOUT_MS", "300"},
                  {"KILN_REMOTE_CACHE_LOCK_TTL_MS", "9000"},
                  {"KILN_REMOTE_CACHE_WAIT_MS", "45000"},
                  {"KILN_REMOTE_CACHE_RETRY_MS", "2500"}};
    const auto r = kiln::Config::from_environment().remote;
    REQUIRE(r.has_value());
    CHECK(r->endpoint.user == "kiln");
    CHECK(r->endpoint.password == "from-env");
    CHECK(r->endpoint.port == 6400);
    CHECK(r->endpoint.db == 2);
    CHECK(r->key_prefix == "fleet-a:");
    CHECK(r->secret == "hmac key");
    CHECK(r->connect_timeout.count() == 150);
    CHECK(r->command_timeout.count() == 300);
    CHECK(r->lock_ttl.count() == 9000);
    CHECK(r->wait_bound.count() == 45000);
    CHECK(r->retry_after.count() == 2500);
  }
  {
    ScopedEnv env{{"KILN_REMOTE_CACHE", "http://x"}};
    CHECK_THAT(error_of([] { kiln::Config::from_environment(); }, ErrorCode::kInvalidArgument),
               Contains("KILN_REMOTE_CACHE"));
  }
  {
    ScopedEnv env{{"KILN_REMOTE_CACHE", "redis://h:1"}, {"KILN_REMOTE_CACHE_TIMEOUT_MS", "5s"}};
    CHECK_THAT(error_of([] { kiln::Config::from_environment(); }, ErrorCode::kInvalidArgument),
               Contains("KILN_REMOTE_CACHE_TIMEOUT_MS='5s'"));
  }
  {
    ScopedEnv env{{"KILN_REMOTE_CACHE", "redis://h:1"}, {"KILN_REMOTE_CACHE_LOCK_TTL_MS", "10"}};
    CHECK_THAT(error_of([] { kiln::Config::from_environment(); }, ErrorCode::kInvalidArgument),
               Contains("100.."));
  }
}

TEST_CASE("remote value: signed values verify only with their secret and only for their key", "[unit]") {
  const CacheKey key{1, 2}, other{3, 4};
  const CacheEntry e = entry_for(key);
  const std::string frame = kiln::encode_entry(e);
  CHECK(kiln::encode_remote_value(e, "") == frame);
  const std::string signed_value = kiln::encode_remote_value(e, "k1");
  CHECK(signed_value.size() == frame.size() + kiln::kSignatureTagBytes + kiln::kSignatureMagic.size());
  CHECK(signed_value.compare(0, frame.size(), frame) == 0);

  CHECK(kiln::decode_remote_value(signed_value, key, "k1").cubin == e.cubin);
  CHECK(kiln::decode_remote_value(signed_value, key, "").cubin == e.cubin);  // no secret: trailer ignored
  CHECK(kiln::decode_remote_value(frame, key, "").cubin == e.cubin);
  const auto reason = [](const std::string& v, const CacheKey& k, const char* secret) {
    try {
      kiln::decode_remote_value(v, k, secret);
    } catch (const kiln::Error& e) {
      CHECK(e.code() == ErrorCode::kCacheCorrupt);
      return e.details().log;
    }
    FAIL("accepted");
    return std::string();
  };
  CHECK_THAT(reason(frame, key, "k1"), Contains("unsigned"));
  CHECK_THAT(reason(signed_value, key, "k2"), Contains("mis-signed"));
  CHECK_THAT(reason(signed_value, other, "k1"), Contains("key echo mismatch"));
  std::string tampered = signed_value;
  tampered[20] ^= 1;  // inside the key echo: the tag no longer matches
  CHECK_THAT(reason(tampered, key, "k1"), Contains("mis-signed"));
  CHECK_THAT(reason(frame.substr(0, 50), key, ""), Contains("truncated"));
}
