#include "kiln/cache/redis_client.h"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <sys/time.h>

#include <cerrno>
#include <charconv>
#include <cstring>

#include <fmt/format.h>

#include "kiln/jit/error.h"

namespace kiln {

namespace {

timeval to_timeval(std::chrono::milliseconds ms) {
  const long long n = std::max<long long>(1, ms.count());
  return timeval{static_cast<time_t>(n / 1000), static_cast<suseconds_t>((n % 1000) * 1000)};
}

// hiredis writes with write(2): a write to a connection the server has closed raises SIGPIPE,
// whose default action kills the process. A library must not change the process's signal
// dispositions, so the signal is blocked on this thread for the call and a SIGPIPE it raised is
// consumed before the mask is restored.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~SigpipeGuard() {
    if (!was_pending_) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec zero{0, 0};
        while (sigtimedwait(&pipe_, nullptr, &zero) < 0 && errno == EINTR) {
        }
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  sigset_t pipe_;
  sigset_t old_;
  bool was_pending_ = false;
};

RedisReply convert(const redisReply* r) {
  RedisReply out;
  switch (r->type) {
    case REDIS_REPLY_STRING: out.type = RedisReply::Type::kString; break;
    case REDIS_REPLY_STATUS: out.type = RedisReply::Type::kStatus; break;
    case REDIS_REPLY_ERROR: out.type = RedisReply::Type::kError; break;
    case REDIS_REPLY_INTEGER: out.type = RedisReply::Type::kInteger; break;
    case REDIS_REPLY_ARRAY: out.type = RedisReply::Type::kArray; break;
    default: out.type = RedisReply::Type::kNil; break;
  }
  if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS || r->type == REDIS_REPLY_ERROR) {
    out.str.assign(r->str, r->len);
  }
  out.integer = r->integer;
  if (r->type == REDIS_REPLY_ARRAY) {
    out.elements.reserve(r->elements);
    for (std::size_t i = 0; i < r->elements; ++i) out.elements.push_back(convert(r->element[i]));
  }
  return out;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

[[noreturn]] void bad_url(std::string_view why) {
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("remote cache URL is malformed: {}; expected redis://[user:password@]host:port[/db]", why));
}

std::string percent_decode(std::string_view s, std::string_view what) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out.push_back(s[i]);
      continue;
    }
    const int hi = i + 2 < s.size() ? hex_value(s[i + 1]) : -1;
    const int lo = i + 2 < s.size() ? hex_value(s[i + 2]) : -1;
    if (hi < 0 || lo < 0) bad_url(fmt::format("the {} has a '%' not followed by two hex digits", what));
    out.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return out;
}

int parse_int(std::string_view s, int lo, int hi, std::string_view what) {
  int v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || v < lo || v > hi) {
    bad_url(fmt::format("{} '{}' is not a number in {}..{}", what, s, lo, hi));
  }
  return v;
}

}  // namespace

std::string RedisEndpoint::describe() const { return fmt::format("redis://{}:{}/{}", host, port, db); }

RedisEndpoint parse_redis_url(std::string_view url) {
  constexpr std::string_view kScheme = "redis://";
  if (!url.starts_with(kScheme)) bad_url("it does not start with redis:// (TLS, rediss://, is not supported)");
  std::string_view rest = url.substr(kScheme.size());
  RedisEndpoint ep;
  const std::size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  if (slash != std::string_view::npos) {
    const std::string_view db = rest.substr(slash + 1);
    if (!db.empty()) ep.db = parse_int(db, 0, 1 << 20, "database number");
  }
  const std::size_t at = authority.rfind('@');
  if (at != std::string_view::npos) {
    const std::string_view userinfo = authority.substr(0, at);
    authority = authority.substr(at + 1);
    const std::size_t colon = userinfo.find(':');
    ep.user = percent_decode(userinfo.substr(0, colon), "user");
    if (colon != std::string_view::npos) ep.password = percent_decode(userinfo.substr(colon + 1), "password");
    // redis://:password@host: the password alone, for servers without ACL users.
  }
  std::string_view host = authority;
  if (!authority.empty() && authority.front() == '[') {  // [IPv6]:port
    const std::size_t close = authority.find(']');
    if (close == std::string_view::npos) bad_url("an IPv6 host lacks its closing ']'");
    host = authority.substr(1, close - 1);
    const std::string_view tail = authority.substr(close + 1);
    if (!tail.empty()) {
      if (tail.front() != ':') bad_url("junk after the IPv6 host");
      ep.port = parse_int(tail.substr(1), 1, 65535, "port");
    }
  } else if (const std::size_t colon = authority.rfind(':'); colon != std::string_view::npos) {
    host = authority.substr(0, colon);
    ep.port = parse_int(authority.substr(colon + 1), 1, 65535, "port");
  }
  if (host.empty()) bad_url("the host is empty");
  ep.host = std::string(host);
  return ep;
}

struct RedisConnection::Context {
  redisContext* c = nullptr;
  ~Context() {
    if (c != nullptr) redisFree(c);
  }
};

RedisConnection::RedisConnection(const RedisEndpoint& endpoint, std::chrono::milliseconds connect_timeout,
                                 std::chrono::milliseconds command_timeout)
    : ctx_(std::make_unique<Context>()), where_(endpoint.describe()) {
  ctx_->c = redisConnectWithTimeout(endpoint.host.c_str(), endpoint.port, to_timeval(connect_timeout));
  if (ctx_->c == nullptr) {
    throw Error(ErrorCode::kCacheIo, fmt::format("cannot connect to {}: out of memory", where_));
  }
  if (ctx_->c->err != 0) {
    throw Error(ErrorCode::kCacheIo, fmt::format("cannot connect to {} within {} ms: {}", where_,
                                                 connect_timeout.count(), ctx_->c->errstr));
  }
  if (redisSetTimeout(ctx_->c, to_timeval(command_timeout)) != REDIS_OK) {
    throw Error(ErrorCode::kCacheIo, fmt::format("cannot set the command timeout on {}: {}", where_, ctx_->c->errstr));
  }
  // The connect timeout bounds the handshake too: a server that accepts connections but does not
  // answer (stopped, overloaded) must not stall start-up for longer than configured.
  if (!endpoint.password.empty()) {
    const RedisReply r = endpoint.user.empty() ? command({"AUTH", endpoint.password})
                                               : command({"AUTH", endpoint.user, endpoint.password});
    if (r.is_error()) {
      throw Error(ErrorCode::kCacheIo,
                  fmt::format("{} refused the credentials{}: {}; check the user and password in KILN_REMOTE_CACHE "
                              "or KILN_REMOTE_CACHE_PASSWORD",
                              where_, endpoint.user.empty() ? "" : fmt::format(" of user '{}'", endpoint.user), r.str));
    }
  }
  if (endpoint.db != 0) {
    const RedisReply r = command({"SELECT", std::to_string(endpoint.db)});
    if (r.is_error()) throw Error(ErrorCode::kCacheIo, fmt::format("{}: SELECT {} failed: {}", where_, endpoint.db, r.str));
  }
}

RedisConnection::~RedisConnection() = default;

RedisReply RedisConnection::command(const std::vector<std::string_view>& args) {
  if (broken_) throw Error(ErrorCode::kInternal, fmt::format("command on a broken connection to {}", where_));
  std::vector<const char*> argv;
  std::vector<std::size_t> lens;
  argv.reserve(args.size());
  lens.reserve(args.size());
  for (std::string_view a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  void* raw = nullptr;
  {
    SigpipeGuard guard;
    errno = 0;
    raw = redisCommandArgv(ctx_->c, static_cast<int>(argv.size()), argv.data(), lens.data());
  }
  if (raw == nullptr) {
    const int err = errno;
    broken_ = true;
    const bool timeout = ctx_->c->err == REDIS_ERR_IO && (err == EAGAIN || err == EWOULDBLOCK);
    peer_closed_ = ctx_->c->err == REDIS_ERR_EOF || err == ECONNRESET || err == EPIPE;
    throw Error(ErrorCode::kCacheIo, timeout ? fmt::format("{} did not answer {} in time (command timeout)", where_, args.front())
                                             : fmt::format("{}: {} failed: {}", where_, args.front(), ctx_->c->errstr));
  }
  std::unique_ptr<redisReply, void (*)(void*)> reply(static_cast<redisReply*>(raw), freeReplyObject);
  return convert(reply.get());
}

}  // namespace kiln
