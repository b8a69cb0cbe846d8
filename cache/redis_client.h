#pragma once
// RedisConnection: one blocking connection to a Redis server through hiredis, with a connect
// timeout and a per-command timeout, so no call blocks longer than those bounds whatever the
// server does (down, slow, stopped). Not thread-safe: one thread uses a connection at a time.
#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

struct RedisEndpoint {
  std::string host;
  int port = 6379;
  int db = 0;
  std::string user;      // ACL user; empty: AUTH with the password only (or no AUTH)
  std::string password;  // empty: no AUTH

  // "redis://host:port/db" (never the password), for messages.
  std::string describe() const;
};

// redis://[user[:password]@]host[:port][/db]; user and password may be percent-encoded.
// Throws Error(kInvalidArgument) saying what is wrong.
RedisEndpoint parse_redis_url(std::string_view url);

struct RedisReply {
  enum class Type { kNil, kString, kInteger, kStatus, kError, kArray };
  Type type = Type::kNil;
  std::string str;  // kString, kStatus, kError
  long long integer = 0;
  std::vector<RedisReply> elements;

  bool is_error() const { return type == Type::kError; }
};

class RedisConnection {
 public:
  // Connects, then AUTHs and SELECTs when the endpoint asks for it. Throws Error(kCacheIo) naming
  // the endpoint when the server cannot be reached in time or refuses the credentials.
  RedisConnection(const RedisEndpoint& endpoint, std::chrono::milliseconds connect_timeout,
                  std::chrono::milliseconds command_timeout);
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  // Sends one command (binary-safe arguments) and reads its reply. An error reply from the server
  // is returned as Type::kError. Throws Error(kCacheIo) on a transport failure or a timeout; the
  // connection is then broken() and must be dropped.
  RedisReply command(const std::vector<std::string_view>& args);

  bool broken() const { return broken_; }
  // The last transport failure was the peer closing the connection (e.g. a restarted server), as
  // opposed to a timeout: a fresh connection may well succeed at once.
  bool peer_closed() const { return peer_closed_; }

 private:
  struct Context;
  std::unique_ptr<Context> ctx_;
  std::string where_;
  bool broken_ = false;
  bool peer_closed_ = false;
};

}  // namespace kiln
