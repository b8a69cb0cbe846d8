// The remote tier against a real redis-server (one per test, on a free port), in one process:
// each "host" is a CubinStore with its own cache directory and its own RemoteStore, so hosts meet
// only through Redis. Builds are cheap deterministic fakes; the fleet test (fleet_supervisor.cpp)
// runs real processes and real NVRTC compiles.
#include <xxhash.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kiln/cache/cubin_store.h"
#include "kiln/cache/remote_store.h"
#include "kiln/cache/remote_value.h"
#include "kiln/jit/error.h"
#include "tests/support/redis_server.h"
#include "tests/support/stderr_capture.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;
using kiln::CacheEntry;
using kiln::CacheKey;
using kiln::CubinStore;
using kiln::RemoteOptions;
using kiln::RemoteStore;
using kiln::testing::RedisServer;
using kiln::testing::StderrCapture;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

CacheKey key_n(int i) {
  const auto n = static_cast<std::uint64_t>(i);
  return CacheKey{0x5eed5eed00000000ULL + n * 0x9e3779b97f4a7c15ULL, n * 7 + 1};
}

// What a compile of `key` produces: deterministic bytes, so every host must end up with these.
CacheEntry make_entry(const CacheKey& key, std::size_t cubin_bytes = 4096) {
  CacheEntry e;
  e.key = key;
  e.semantic_key = "test.remote/sm_90a/" + key.hex().substr(0, 8);
  e.metadata = {{"arch", "sm_90a"}};
  e.cubin.resize(cubin_bytes);
  for (std::size_t i = 0; i < cubin_bytes; ++i) e.cubin[i] = static_cast<char>((i * 131 + key.lo) & 0xff);
  return e;
}

// Small timeouts, so the fault tests run in well under a second each.
RemoteOptions fast_options(const RedisServer& server) {
  RemoteOptions o;
  o.endpoint = server.endpoint();
  o.key_prefix = "t:";
  o.connect_timeout = milliseconds(200);
  o.command_timeout = milliseconds(200);
  o.lock_ttl = milliseconds(600);
  o.wait_bound = milliseconds(20000);
  o.retry_after = milliseconds(300);
  return o;
}

// One machine of the fleet: its own cache directory and its own connection to Redis.
struct Host {
  explicit Host(const RemoteOptions& o)
      : dir("kiln_remote_host"),
        remote(std::make_shared<RemoteStore>(o)),
        store(CubinStore::Options{.root = dir.path(), .remote = remote}) {}
  kiln::testing::TempDir dir;
  std::shared_ptr<RemoteStore> remote;
  CubinStore store;
};

// Counts the builds of each key across every host of a test; each build sleeps `ms`.
struct Builds {
  explicit Builds(int ms = 0) : ms(ms) {}
  std::function<CacheEntry()> of(const CacheKey& key) {
    return [this, key] {
      {
        std::lock_guard<std::mutex> lock(mutex);
        ++count[key.hex()];
      }
      std::this_thread::sleep_for(milliseconds(ms));
      return make_entry(key);
    };
  }
  int of_key(const CacheKey& key) {
    std::lock_guard<std::mutex> lock(mutex);
    return count[key.hex()];
  }
  int total() {
    std::lock_guard<std::mutex> lock(mutex);
    int n = 0;
    for (const auto& [k, c] : count) n += c;
    return n;
  }
  int ms;
  std::mutex mutex;
  std::map<std::string, int> count;
};

std::size_t keys_matching(const RedisServer& server, const std::string& pattern) {
  return server.command({"KEYS", pattern}).elements.size();
}

long long used_memory(const RedisServer& server) {
  const std::string info = server.command({"INFO", "memory"}).str;
  const std::size_t at = info.find("used_memory:");
  REQUIRE(at != std::string::npos);
  return std::stoll(info.substr(at + 12));
}

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

std::size_t count_of(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1)) ++n;
  return n;
}

// The frame of `entry` with its key echo replaced and the checksum recomputed: only the echo is wrong.
std::string frame_with_echo(const CacheEntry& entry, const CacheKey& echo) {
  std::string frame = kiln::encode_entry(entry);
  for (int i = 0; i < 8; ++i) {
    frame[12 + i] = static_cast<char>((echo.hi >> (8 * (7 - i))) & 0xff);
    frame[20 + i] = static_cast<char>((echo.lo >> (8 * (7 - i))) & 0xff);
  }
  XXH128_canonical_t canon;
  XXH128_canonicalFromHash(&canon, XXH3_128bits(frame.data(), frame.size() - 16));
  frame.replace(frame.size() - 16, 16, reinterpret_cast<const char*>(canon.digest), 16);
  return frame;
}

// A frame whose cubin length field claims 2^62 bytes, checksum recomputed.
std::string frame_with_huge_length(const CacheEntry& entry) {
  std::string frame = kiln::encode_entry(entry);
  const std::size_t cubin_len_at = frame.size() - 16 - entry.cubin.size() - 8;
  for (int i = 0; i < 8; ++i) frame[cubin_len_at + i] = static_cast<char>(i == 7 ? 0x40 : 0);
  XXH128_canonical_t canon;
  XXH128_canonicalFromHash(&canon, XXH3_128bits(frame.data(), frame.size() - 16));
  frame.replace(frame.size() - 16, 16, reinterpret_cast<const char*>(canon.digest), 16);
  return frame;
}

}  // namespace

TEST_CASE("remote tier: a remote hit is verified, published to the local disk, then served from disk", "[remote]") {
  RedisServer server;
  const RemoteOptions o = fast_options(server);
  const CacheKey key = key_n(1);
  Builds builds;
  Host a(o), b(o);
  bool built = false;
  auto first = a.store.get_or_build(key, builds.of(key), &built);
  CHECK(built);
  CHECK_FALSE(first.from_remote);
  CHECK(a.remote->counters().uploads == 1);
  CHECK(a.remote->counters().misses == 1);

  auto second = b.store.get_or_build(key, builds.of(key), &built);
  CHECK_FALSE(built);
  CHECK(second.from_remote);
  CHECK(second.tier == kiln::Tier::kWritable);
  CHECK(fs::is_regular_file(second.file));
  CHECK(second.entry.cubin == make_entry(key).cubin);
  CHECK(b.remote->counters().hits == 1);
  // The next lookup is a local disk hit: Redis is not asked again.
  server.command({"FLUSHALL"});
  auto third = b.store.get_or_build(key, builds.of(key), &built);
  CHECK_FALSE(built);
  CHECK_FALSE(third.from_remote);
  CHECK(b.remote->counters().hits == 1);
  CHECK(builds.total() == 1);
}

TEST_CASE("remote tier: hosts x threads warming overlapping keys build each key once fleet-wide",
          "[remote][concurrency]") {
  RedisServer server;
  const RemoteOptions o = fast_options(server);
  constexpr int kHosts = 4, kThreads = 4, kKeys = 8;
  Builds builds(30);
  std::vector<std::unique_ptr<Host>> hosts;
  for (int h = 0; h < kHosts; ++h) hosts.push_back(std::make_unique<Host>(o));
  std::mutex got_mutex;
  std::map<std::string, std::set<std::string>> got;  // key -> distinct cubins handed out
  std::vector<std::thread> threads;
  for (int h = 0; h < kHosts; ++h) {
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, h, t] {
        std::vector<int> order(kKeys);
        for (int i = 0; i < kKeys; ++i) order[i] = i;
        std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<unsigned>(h * 100 + t)));
        for (int i : order) {
          const CacheKey key = key_n(100 + i);
          auto hit = hosts[static_cast<std::size_t>(h)]->store.get_or_build(key, builds.of(key));
          std::lock_guard<std::mutex> lock(got_mutex);
          got[key.hex()].insert(hit.entry.cubin);
        }
      });
    }
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kKeys; ++i) {
    const CacheKey key = key_n(100 + i);
    INFO("key " << i);
    CHECK(builds.of_key(key) == 1);
    CHECK(got[key.hex()] == std::set<std::string>{make_entry(key).cubin});
  }
  std::uint64_t hits = 0, uploads = 0, waits = 0;
  for (const auto& h : hosts) {
    hits += h->remote->counters().hits;
    uploads += h->remote->counters().uploads;
    waits += h->remote->counters().lock_waits;
    CHECK(h->remote->counters().errors == 0);
  }
  CHECK(uploads == kKeys);
  CHECK(hits == (kHosts - 1) * kKeys);  // every other host took each key from Redis
  INFO("lock waits: " << waits);
  CHECK(keys_matching(server, "t:lock:*") == 0);  // every lock was released
}

TEST_CASE("remote tier: a dead lock holder releases its key at the lock's expiry", "[remote]") {
  RedisServer server;
  const RemoteOptions o = fast_options(server);
  const CacheKey key = key_n(2);
  Host a(o);
  // A holder that died: its lock stays until its expiry, nobody extends it.
  server.command({"SET", a.remote->lock_key(key), "dead-host/1/0/0", "PX", "500"});
  Builds builds;
  const auto t0 = Clock::now();
  bool built = false;
  a.store.get_or_build(key, builds.of(key), &built);
  const double waited = ms_since(t0);
  CHECK(built);
  CHECK(a.remote->counters().lock_waits == 1);
  CHECK(a.remote->counters().wait_timeouts == 0);
  CHECK(waited >= 400);
  CHECK(waited < 2000);
  CHECK(keys_matching(server, "t:lock:*") == 0);
}

TEST_CASE("remote tier: no key waits longer than the wait bound, then the waiter compiles it", "[remote]") {
  RedisServer server;
  RemoteOptions o = fast_options(server);
  o.wait_bound = milliseconds(300);
  const CacheKey key = key_n(3);
  Host a(o);
  const std::string lock = a.remote->lock_key(key);
  server.command({"SET", lock, "stuck-host/1/0/0", "PX", "60000"});
  Builds builds;
  const auto t0 = Clock::now();
  bool built = false;
  a.store.get_or_build(key, builds.of(key), &built);
  const double waited = ms_since(t0);
  CHECK(built);
  CHECK(a.remote->counters().wait_timeouts == 1);
  CHECK(waited >= 300);
  CHECK(waited < 1500);
  CHECK(a.remote->counters().uploads == 1);
  CHECK(server.command({"GET", lock}).str == "stuck-host/1/0/0");  // someone else's lock is never deleted
}

TEST_CASE("remote tier: the lock is extended while a compile outlasts its TTL", "[remote][concurrency]") {
  RedisServer server;
  const RemoteOptions o = fast_options(server);  // lock TTL 600 ms
  const CacheKey key = key_n(4);
  Builds builds(1500);
  Host a(o), b(o);
  std::thread holder([&] { a.store.get_or_build(key, builds.of(key)); });
  // b asks once a holds the lock, and keeps waiting through two and a half TTLs.
  const auto t0 = Clock::now();
  while (keys_matching(server, "t:lock:*") == 0 && ms_since(t0) < 5000) std::this_thread::sleep_for(milliseconds(5));
  bool built = true;
  auto hit = b.store.get_or_build(key, builds.of(key), &built);
  holder.join();
  CHECK_FALSE(built);
  CHECK(hit.from_remote);
  CHECK(builds.of_key(key) == 1);
  CHECK(b.remote->counters().lock_waits == 1);
}

TEST_CASE("remote tier: a failing build releases the lock at once, and a lost lock is not deleted by its old owner",
          "[remote]") {
  RedisServer server;
  const RemoteOptions o = fast_options(server);
  Host a(o), b(o);
  const CacheKey key = key_n(5);
  CHECK_THROWS_AS(a.store.get_or_build(key, [&]() -> CacheEntry {
    throw kiln::Error(kiln::ErrorCode::kCompileFailed, "test compile failure");
  }),
                  kiln::Error);
  CHECK(keys_matching(server, "t:lock:*") == 0);
  const auto t0 = Clock::now();
  bool built = false;
  Builds builds;
  b.store.get_or_build(key, builds.of(key), &built);
  CHECK(built);
  CHECK(ms_since(t0) < 500);  // no wait for an expiry

  // While a compiles, its lock is taken over (as after an expiry); a's release leaves it alone.
  const CacheKey other = key_n(6);
  const std::string lock = a.remote->lock_key(other);
  a.store.get_or_build(other, [&] {
    server.command({"SET", lock, "new-owner/1/0/0", "PX", "60000"});
    return make_entry(other);
  });
  CHECK(server.command({"GET", lock}).str == "new-owner/1/0/0");
}

TEST_CASE("remote tier: bad and hostile values are never loaded, are counted and are replaced", "[remote]") {
  RedisServer server;
  RemoteOptions o = fast_options(server);
  o.max_entry_bytes = 64 * 1024;
  const CacheKey key = key_n(7);
  const CacheKey other = key_n(8);
  const CacheEntry good = make_entry(key);
  const std::string frame = kiln::encode_entry(good);
  std::string flipped = frame;
  flipped[frame.size() - 16 - 100] ^= 0x10;  // inside the cubin

  struct Case {
    std::string name;
    std::string value;  // empty with list: a Redis list instead of a string
    std::string secret;
    bool list = false;
  };
  const std::string s = "s3cret";
  const std::vector<Case> cases = {
      {"truncated", frame.substr(0, frame.size() / 2), ""},
      {"bit-flipped", flipped, ""},
      {"wrong key echo", frame_with_echo(good, other), ""},
      {"valid frame for another key", kiln::encode_entry(make_entry(other)), ""},
      {"huge length field", frame_with_huge_length(good), ""},
      {"huge value", std::string(3 * o.max_entry_bytes, 'x'), ""},
      {"garbage", "not a kiln entry at all", ""},
      {"empty string", "", ""},
      {"a list, not a string", "", "", true},
      {"unsigned, secret set", frame, s},
      {"mis-signed, secret set", kiln::encode_remote_value(good, "another secret"), s},
      {"signed for another key, secret set", kiln::encode_remote_value(make_entry(other), s), s},
      {"signed, tag bit-flipped", [&] {
         std::string v = kiln::encode_remote_value(good, s);
         v[v.size() - 9] ^= 0x01;
         return v;
       }(), s},
  };
  for (const Case& c : cases) {
    INFO("case: " << c.name);
    server.command({"FLUSHALL"});
    RemoteOptions with = o;
    with.secret = c.secret;
    const std::string ek = RemoteStore(with).entry_key(key);
    if (c.list) server.command({"RPUSH", ek, "a", "b"});
    else server.command({"SET", ek, c.value});

    Builds builds;
    Host a(with);
    StderrCapture capture;
    bool built = false;
    auto hit = a.store.get_or_build(key, builds.of(key), &built);
    const std::string log = capture.text();
    CHECK(built);  // never loaded: built here instead
    CHECK_FALSE(hit.from_remote);
    CHECK(hit.entry.cubin == good.cubin);
    CHECK(a.remote->counters().rejected == 1);
    CHECK(count_of(log, "was rejected") == 1);
    CHECK(a.remote->counters().uploads == 1);  // replaced ...
    Host b(with);
    bool b_built = true;
    auto replaced = b.store.get_or_build(key, builds.of(key), &b_built);  // ... by a correct one
    CHECK_FALSE(b_built);
    CHECK(replaced.from_remote);
    CHECK(replaced.entry.cubin == good.cubin);
    CHECK(b.remote->counters().rejected == 0);
  }
}

TEST_CASE("remote tier: rejections warn once per store, and readers without the secret accept signed entries", "[remote]") {
  RedisServer server;
  RemoteOptions o = fast_options(server);
  o.secret = "s3cret";
  Host a(o);
  Builds builds;
  StderrCapture capture;
  for (int i = 0; i < 3; ++i) {
    const CacheKey key = key_n(20 + i);
    server.command({"SET", a.remote->entry_key(key), kiln::encode_entry(make_entry(key))});  // unsigned
    a.store.get_or_build(key, builds.of(key));
  }
  CHECK(a.remote->counters().rejected == 3);
  CHECK(count_of(capture.text(), "was rejected") == 1);

  RemoteOptions plain = o;
  plain.secret.clear();
  Host b(plain);
  bool built = true;
  auto hit = b.store.get_or_build(key_n(20), builds.of(key_n(20)), &built);
  CHECK_FALSE(built);
  CHECK(hit.from_remote);
  CHECK(builds.total() == 3);
}

TEST_CASE("remote tier: Redis stopped (SIGSTOP) mid-run: every key is served within the timeouts", "[remote]") {
  RedisServer server;
  const RemoteOptions o = fast_options(server);  // connect and command timeouts 200 ms, retry 300 ms
  Builds builds(20);
  constexpr int kKeys = 12, kThreads = 4;
  Host a(o);
  {
    // Warm-up with a healthy server, so the stop hits pooled connections too.
    a.store.get_or_build(key_n(30), builds.of(key_n(30)));
  }
  server.stop();
  StderrCapture capture;
  std::atomic<int> next{0};
  std::atomic<int> wrong{0};
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = next++; i < kKeys; i = next++) {
        const CacheKey key = key_n(31 + i);
        if (a.store.get_or_build(key, builds.of(key)).entry.cubin != make_entry(key).cubin) ++wrong;
      }
    });
  }
  for (auto& t : threads) t.join();
  const double wall = ms_since(t0);
  const std::string log = capture.text();
  CHECK(wrong == 0);
  CHECK(builds.total() == 1 + kKeys);
  // The builds alone take 12 x 20 ms serially; the stalled server may cost each thread one command
  // timeout before the breaker opens, and a probe per retry period after it: never the lock TTL or
  // the wait bound.
  INFO("wall " << wall << " ms");
  CHECK(wall < kKeys * 20 + 3 * (200 + 200));
  CHECK(count_of(log, "is unavailable") == 1);
  CHECK(a.remote->counters().errors >= 1);

  // Resumed: after the retry period the remote tier is used again.
  server.resume();
  std::this_thread::sleep_for(milliseconds(400));
  const CacheKey after = key_n(60);
  a.store.get_or_build(after, builds.of(after));
  Host b(o);
  bool built = true;
  b.store.get_or_build(after, builds.of(after), &built);
  CHECK_FALSE(built);
}

TEST_CASE("remote tier: Redis stopped while a host waits for another's compile: the waiter compiles", "[remote]") {
  RedisServer server;
  const RemoteOptions o = fast_options(server);
  const CacheKey key = key_n(40);
  Builds builds(800);
  Host a(o), b(o);
  std::thread holder([&] { a.store.get_or_build(key, builds.of(key)); });
  const auto t0 = Clock::now();
  while (keys_matching(server, "t:lock:*") == 0 && ms_since(t0) < 5000) std::this_thread::sleep_for(milliseconds(5));
  std::thread stopper([&] {
    std::this_thread::sleep_for(milliseconds(150));
    server.stop();
  });
  const auto t1 = Clock::now();
  auto hit = b.store.get_or_build(key, builds.of(key));
  const double wall = ms_since(t1);
  stopper.join();
  holder.join();
  server.resume();
  CHECK(hit.entry.cubin == make_entry(key).cubin);
  CHECK(builds.of_key(key) == 2);  // the waiter gave up on Redis and compiled
  INFO("waiter wall " << wall << " ms");
  CHECK(wall < 150 + 2 * 200 + 800 + 500);  // its wait, one timeout, its own build, slack
}

TEST_CASE("remote tier: Redis killed: hosts compile locally at once, with one warning", "[remote]") {
  RedisServer server;
  const RemoteOptions o = fast_options(server);
  Host a(o);
  Builds builds(10);
  a.store.get_or_build(key_n(50), builds.of(key_n(50)));
  server.kill();
  StderrCapture capture;
  const auto t0 = Clock::now();
  for (int i = 0; i < 10; ++i) {
    const CacheKey key = key_n(51 + i);
    CHECK(a.store.get_or_build(key, builds.of(key)).entry.cubin == make_entry(key).cubin);
  }
  const double wall = ms_since(t0);
  CHECK(count_of(capture.text(), "is unavailable") == 1);
  INFO("wall " << wall << " ms");
  CHECK(wall < 10 * 10 + 2 * 200 + 300);
  // A fresh host starting while Redis is down is not held up either.
  const auto t1 = Clock::now();
  Host b(o);
  b.store.get_or_build(key_n(70), builds.of(key_n(70)));
  CHECK(ms_since(t1) < 10 + 200 + 300);
}

TEST_CASE("remote tier: Redis restarted empty: entries are rebuilt once, pooled connections recover silently",
          "[remote]") {
  RedisServer server;
  const RemoteOptions o = fast_options(server);
  Host a(o);
  Builds builds;
  for (int i = 0; i < 3; ++i) a.store.get_or_build(key_n(80 + i), builds.of(key_n(80 + i)));
  server.kill();
  server.start();
  CHECK(keys_matching(server, "t:*") == 0);
  const CacheKey fresh = key_n(90);
  a.store.get_or_build(fresh, builds.of(fresh));
  CHECK(a.remote->counters().errors == 0);  // the stale pooled connection was replaced, not counted
  CHECK(a.remote->counters().uploads == 4);
  Host b(o);
  for (int i = 0; i < 3; ++i) {
    bool built = false;
    b.store.get_or_build(key_n(80 + i), builds.of(key_n(80 + i)), &built);
    CHECK(built);  // gone from Redis: compiled once more, by b
  }
  Host c(o);
  for (int i = 0; i < 3; ++i) {
    bool built = true;
    c.store.get_or_build(key_n(80 + i), builds.of(key_n(80 + i)), &built);
    CHECK_FALSE(built);
  }
  CHECK(builds.total() == 7);
}

TEST_CASE("remote tier: a tiny maxmemory evicts entries or refuses writes, and every key is still served", "[remote]") {
  RedisServer server;
  const RemoteOptions o = fast_options(server);
  Builds builds;
  SECTION("allkeys-lru: entries are evicted") {
    const long long used = used_memory(server);
    server.command({"CONFIG", "SET", "maxmemory-policy", "allkeys-lru"});
    server.command({"CONFIG", "SET", "maxmemory", std::to_string(used + 256 * 1024)});
    constexpr int kKeys = 40;  // 40 x ~20 KiB: about three times what fits
    Host a(o), b(o);
    for (Host* h : {&a, &b}) {
      for (int i = 0; i < kKeys; ++i) {
        const CacheKey key = key_n(200 + i);
        CHECK(h->store.get_or_build(key, [&] {
          builds.of(key)();
          return make_entry(key, 20000);
        }).entry.cubin == make_entry(key, 20000).cubin);
      }
    }
    const long long stored = server.command({"DBSIZE"}).integer;
    INFO("entries left in Redis: " << stored);
    CHECK(stored < kKeys);
    CHECK(builds.total() > kKeys);  // b rebuilt what was evicted
    CHECK(a.remote->counters().rejected + b.remote->counters().rejected == 0);
  }
  SECTION("noeviction below current use: every write is refused") {
    server.command({"CONFIG", "SET", "maxmemory-policy", "noeviction"});
    server.command({"CONFIG", "SET", "maxmemory", "1"});
    Host a(o);
    StderrCapture capture;
    const auto t0 = Clock::now();
    for (int i = 0; i < 5; ++i) {
      const CacheKey key = key_n(300 + i);
      CHECK(a.store.get_or_build(key, builds.of(key)).entry.cubin == make_entry(key).cubin);
    }
    CHECK(ms_since(t0) < 1000);
    CHECK(builds.total() == 5);
    CHECK(a.remote->counters().uploads == 0);
    CHECK(a.remote->counters().errors >= 5);
    CHECK(count_of(capture.text(), "refused") == 1);
  }
}

TEST_CASE("remote tier: AUTH with an ACL user and password, and wrong credentials serve locally with one warning",
          "[remote]") {
  // The kiln user has exactly the rights cache/README.md lists, on its prefix only.
  RedisServer server({"--user", "default", "on", ">adminpw", "~*", "&*", "+@all", "--user", "kiln", "on", ">s3cret",
                      "~t:*", "-@all", "+get", "+set", "+eval", "+type", "+strlen", "+pexpire", "+del", "+hincrby",
                      "+hgetall", "+scan"},
                     "adminpw");
  RemoteOptions o = fast_options(server);
  o.endpoint.user = "kiln";
  o.endpoint.password = "s3cret";
  const CacheKey key = key_n(400);
  Builds builds;
  {
    Host a(o), b(o);
    a.store.get_or_build(key, builds.of(key));
    bool built = true;
    b.store.get_or_build(key, builds.of(key), &built);
    CHECK_FALSE(built);
    CHECK(a.remote->counters().errors == 0);
    CHECK(b.remote->counters().errors == 0);
    CHECK(a.remote->fleet_stats().entries == 1);
  }
  const kiln::RemoteFleetStats stats = RemoteStore(o).fleet_stats();  // both flushed their counters
  CHECK(stats.counters.uploads == 1);
  CHECK(stats.counters.hits == 1);
  CHECK(stats.counters.errors == 0);
  RemoteOptions wrong = o;
  wrong.endpoint.password = "guess";
  Host c(wrong);
  StderrCapture capture;
  bool built = false;
  c.store.get_or_build(key, builds.of(key), &built);
  const std::string log = capture.text();
  CHECK(built);
  CHECK(count_of(log, "refused the credentials of user 'kiln'") == 1);
  CHECK(log.find("s3cret") == std::string::npos);
  CHECK(log.find("guess") == std::string::npos);
}

TEST_CASE("remote tier: each process's counters add up in the fleet hash", "[remote]") {
  RedisServer server;
  const RemoteOptions o = fast_options(server);
  Builds builds;
  {
    Host a(o), b(o);
    for (int i = 0; i < 3; ++i) a.store.get_or_build(key_n(500 + i), builds.of(key_n(500 + i)));
    for (int i = 0; i < 4; ++i) b.store.get_or_build(key_n(500 + i), builds.of(key_n(500 + i)));
  }  // destroyed: counters flushed
  const kiln::RemoteFleetStats s = RemoteStore(o).fleet_stats();
  CHECK(s.reachable);
  CHECK(s.entries == 4);
  CHECK(s.locks == 0);
  CHECK(s.counters.uploads == 4);
  CHECK(s.counters.hits == 3);
  CHECK(s.counters.misses == 4);
  CHECK(s.counters.errors == 0);
  server.kill();
  const kiln::RemoteFleetStats down = RemoteStore(o).fleet_stats();
  CHECK_FALSE(down.reachable);
  CHECK(down.problem.find("cannot connect") != std::string::npos);
}
