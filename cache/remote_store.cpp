#include "kiln/cache/remote_store.h"

#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "kiln/cache/remote_value.h"
#include "kiln/jit/error.h"
#include "kiln/jit/log.h"

namespace kiln {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr std::size_t kMaxIdleConnections = 16;
constexpr milliseconds kFirstPoll{10};
constexpr milliseconds kMaxPoll{250};
constexpr milliseconds kFlushPeriod{1000};
// Left in place of a lock by a holder whose upload the server refused (out of memory, value too
// large): waiters then compile at once instead of taking the lock one after another.
constexpr std::string_view kUnstorable = "unstorable";

// A value's fingerprint is what the replace script compares before overwriting, so a rejected
// value is replaced only if it is still the one that was judged: the SHA-1 of a string (Redis's
// own sha1hex), or "type:<name>" for a key of another type.
constexpr std::string_view kFetchScript = R"lua(
local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'none' then return false end
if t ~= 'string' then return {0, 'type:' .. t} end
local n = redis.call('STRLEN', KEYS[1])
if n > tonumber(ARGV[1]) then return {n, redis.sha1hex(redis.call('GET', KEYS[1]))} end
return redis.call('GET', KEYS[1])
)lua";

constexpr std::string_view kReplaceScript = R"lua(
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'none' then
  local fp = 'type:' .. t
  if t == 'string' then fp = redis.sha1hex(redis.call('GET', KEYS[1])) end
  if fp ~= ARGV[2] then return 0 end
end
redis.call('SET', KEYS[1], ARGV[1])
return 1
)lua";

// Returns {1} when the lock was taken, else the holder's token.
constexpr std::string_view kLockScript = R"lua(
local holder = redis.call('GET', KEYS[1])
if holder then return holder end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1}
)lua";

constexpr std::string_view kExtendScript = R"lua(
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
)lua";

constexpr std::string_view kReleaseScript = R"lua(
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
)lua";

constexpr std::string_view kMarkUnstorableScript = R"lua(
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) end
return 0
)lua";

constexpr std::string_view kAddCountersScript = R"lua(
for i = 1, #ARGV, 2 do redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1]) end
return 1
)lua";

std::string sha1_hex(std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(data.data(), data.size(), md, &len, EVP_sha1(), nullptr) != 1) {
    throw Error(ErrorCode::kInternal, "SHA-1 failed in libcrypto");
  }
  std::string out;
  for (unsigned int i = 0; i < len; ++i) out += fmt::format("{:02x}", md[i]);
  return out;
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown-host";
  return buf;
}

// Counters in a fixed order, for the fleet hash and its sums.
template <typename C, typename Fn>
void for_each_counter(C& c, Fn&& fn) {
  fn("hits", c.hits);
  fn("misses", c.misses);
  fn("uploads", c.uploads);
  fn("rejected", c.rejected);
  fn("lock_waits", c.lock_waits);
  fn("wait_timeouts", c.wait_timeouts);
  fn("errors", c.errors);
}

std::string glob_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

bool is_hex32(std::string_view s) {
  return s.size() == 32 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

}  // namespace

nlohmann::json RemoteCounters::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for_each_counter(*this, [&](const char* name, std::uint64_t v) { j[name] = v; });
  return j;
}

nlohmann::json RemoteFleetStats::to_json() const {
  nlohmann::json j = {{"endpoint", endpoint}, {"reachable", reachable}};
  if (!reachable) j["problem"] = problem;
  j["entries"] = entries;
  j["locks"] = locks;
  j["counters"] = counters.to_json();
  return j;
}

struct RemoteStore::Impl {
  explicit Impl(RemoteOptions options) : o(std::move(options)), where(o.endpoint.describe()) {
    std::random_device rd;
    token_prefix = fmt::format("{}/{}/{:08x}{:08x}", host_name(), ::getpid(), rd(), rd());
  }

  // ---- counters
  struct AtomicCounters {
    std::atomic<std::uint64_t> hits{0}, misses{0}, uploads{0}, rejected{0}, lock_waits{0}, wait_timeouts{0}, errors{0};
  };
  RemoteCounters snapshot() const {
    RemoteCounters c;
    c.hits = n.hits.load();
    c.misses = n.misses.load();
    c.uploads = n.uploads.load();
    c.rejected = n.rejected.load();
    c.lock_waits = n.lock_waits.load();
    c.wait_timeouts = n.wait_timeouts.load();
    c.errors = n.errors.load();
    return c;
  }

  // ---- circuit breaker
  bool allow() {
    std::lock_guard<std::mutex> lock(breaker_mutex);
    if (!open) return true;
    if (Clock::now() < retry_at || probing) return false;
    probing = true;  // one probe at a time; everyone else stays local until it answers
    return true;
  }
  void on_success() {
    std::lock_guard<std::mutex> lock(breaker_mutex);
    if (open) log_info("remote cache {} is reachable again", where);
    open = false;
    probing = false;
  }
  void on_failure(const std::string& why) {
    n.errors.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(breaker_mutex);
      open = true;
      probing = false;
      retry_at = Clock::now() + o.retry_after;
      last_problem = why;
    }
    if (!warned_unreachable.exchange(true)) {
      log_warn("remote cache {} is unavailable ({}); kernels are served from the local tiers or compiled here, and "
               "the remote cache is retried every {} ms (this warning is printed once)",
               where, why, o.retry_after.count());
    } else {
      log_debug("remote cache {} failed again: {}", where, why);
    }
  }
  std::string problem() {
    std::lock_guard<std::mutex> lock(breaker_mutex);
    return last_problem;
  }

  // An error reply: the server is up but refused (out of memory, ACL, read-only replica...).
  void on_error_reply(std::string_view what, const std::string& message) {
    n.errors.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(breaker_mutex);
      last_problem = fmt::format("{} refused {}: {}", where, what, message);
    }
    if (!warned_error_reply.exchange(true)) {
      log_warn("remote cache {} refused {}: {}; kernels are still served locally (this warning is printed once)", where,
               what, message);
    }
  }

  // ---- connections
  std::unique_ptr<RedisConnection> take(bool* reused) {
    {
      std::lock_guard<std::mutex> lock(pool_mutex);
      if (!idle.empty()) {
        auto c = std::move(idle.back());
        idle.pop_back();
        *reused = true;
        return c;
      }
    }
    *reused = false;
    return std::make_unique<RedisConnection>(o.endpoint, o.connect_timeout, o.command_timeout);
  }
  void give_back(std::unique_ptr<RedisConnection> c) {
    if (c->broken()) return;
    std::lock_guard<std::mutex> lock(pool_mutex);
    if (idle.size() < kMaxIdleConnections) idle.push_back(std::move(c));
  }

  // One command through the breaker and the pool; nullopt when the remote is unavailable. A pooled
  // connection that the server closed (a restart) is replaced once, with the rest of the pool.
  std::optional<RedisReply> call(const std::vector<std::string_view>& args) {
    if (!allow()) return std::nullopt;
    for (int attempt = 0;; ++attempt) {
      bool reused = false;
      std::unique_ptr<RedisConnection> c;
      try {
        c = take(&reused);
        RedisReply r = c->command(args);
        give_back(std::move(c));
        on_success();
        return r;
      } catch (const Error& e) {
        if (attempt == 0 && reused && c && c->peer_closed()) {
          std::lock_guard<std::mutex> lock(pool_mutex);
          idle.clear();
          continue;
        }
        on_failure(e.what());
        return std::nullopt;
      }
    }
  }

  // ---- entries
  struct Read {
    enum class Status { kHit, kMissing, kRejected, kUnavailable } status = Status::kUnavailable;
    std::optional<CacheEntry> entry;
    std::string fingerprint;  // kRejected
  };

  // `known_bad`: the fingerprint of a rejected value this caller already counted.
  Read read(const CacheKey& key, const std::string& ek, const std::string& known_bad) {
    Read out;
    const std::string max = std::to_string(o.max_entry_bytes);
    const auto r = call({"EVAL", kFetchScript, "1", ek, max});
    if (!r) return out;
    std::string reason;
    if (r->type == RedisReply::Type::kNil) {
      out.status = Read::Status::kMissing;
      return out;
    } else if (r->type == RedisReply::Type::kString) {
      try {
        out.entry = decode_remote_value(r->str, key, o.secret);
        out.status = Read::Status::kHit;
        return out;
      } catch (const Error& e) {
        reason = e.details().log;
        out.fingerprint = sha1_hex(r->str);
      }
    } else if (r->type == RedisReply::Type::kArray && r->elements.size() == 2) {
      out.fingerprint = r->elements[1].str;
      reason = out.fingerprint.starts_with("type:")
                   ? fmt::format("the key holds a Redis {}, not a string", out.fingerprint.substr(5))
                   : fmt::format("the value is {} bytes, more than the {} an entry may have (not transferred)",
                                 r->elements[0].integer, o.max_entry_bytes);
    } else {
      on_error_reply("the entry read", r->is_error() ? r->str : "an unexpected reply");
      return out;
    }
    out.status = Read::Status::kRejected;
    if (out.fingerprint != known_bad) {
      n.rejected.fetch_add(1);
      if (!warned_rejected.exchange(true)) {
        log_warn("remote cache entry {} for key {} was rejected ({}); it is never loaded and will be replaced by a "
                 "correct one. Entries without a valid HMAC tag mean a writer lacks KILN_REMOTE_CACHE_SECRET, uses "
                 "another one, or forged the entry (this warning is printed once)",
                 ek, key.hex(), reason);
      } else {
        log_debug("remote cache entry {} rejected: {}", ek, reason);
      }
    }
    return out;
  }

  enum class Upload { kStored, kPresent, kRefused, kUnavailable };
  // SET NX, or, when `bad` names a rejected value, replace exactly that value.
  Upload upload(const CacheEntry& entry, const std::string& ek, const std::string& bad) {
    const std::string value = encode_remote_value(entry, o.secret);
    const auto r = bad.empty() ? call({"SET", ek, value, "NX"}) : call({"EVAL", kReplaceScript, "1", ek, value, bad});
    if (!r) return Upload::kUnavailable;
    if (r->is_error()) {
      on_error_reply("an upload", r->str);
      return Upload::kRefused;
    }
    const bool stored = r->type == RedisReply::Type::kStatus || (r->type == RedisReply::Type::kInteger && r->integer == 1);
    if (!stored) return Upload::kPresent;
    n.uploads.fetch_add(1);
    return Upload::kStored;
  }

  // ---- locks
  struct Lock {
    enum class Status { kAcquired, kHeld, kUnavailable } status = Status::kUnavailable;
    std::string holder;
  };
  Lock try_lock(const std::string& lk, const std::string& token) {
    Lock out;
    const std::string ttl = std::to_string(o.lock_ttl.count());
    const auto r = call({"EVAL", kLockScript, "1", lk, token, ttl});
    if (!r) return out;
    if (r->type == RedisReply::Type::kArray) {
      out.status = Lock::Status::kAcquired;
    } else if (r->type == RedisReply::Type::kString) {
      // Our own token: a retried call whose first attempt had taken the lock.
      out.status = r->str == token ? Lock::Status::kAcquired : Lock::Status::kHeld;
      out.holder = r->str;
    } else {
      on_error_reply("a lock", r->is_error() ? r->str : "an unexpected reply");
      return out;
    }
    if (out.status == Lock::Status::kAcquired) {
      std::lock_guard<std::mutex> lock(held_mutex);
      held[lk] = token;
    }
    return out;
  }
  void release(const std::string& lk, const std::string& token, bool unstorable) {
    {
      std::lock_guard<std::mutex> lock(held_mutex);
      held.erase(lk);
    }
    // When this fails the lock simply expires after lock_ttl.
    if (unstorable) {
      call({"EVAL", kMarkUnstorableScript, "1", lk, token, kUnstorable, std::to_string(o.lock_ttl.count())});
    } else {
      call({"EVAL", kReleaseScript, "1", lk, token});
    }
  }
  void extend_held() {
    std::vector<std::pair<std::string, std::string>> locks;
    {
      std::lock_guard<std::mutex> lock(held_mutex);
      locks.assign(held.begin(), held.end());
    }
    const std::string ttl = std::to_string(o.lock_ttl.count());
    for (const auto& [lk, token] : locks) {
      const auto r = call({"EVAL", kExtendScript, "1", lk, token, ttl});
      // Lost (expired while Redis stalled, or Redis restarted): another process may compile the
      // key too; both results are valid and SET NX keeps the first.
      if (r && r->type == RedisReply::Type::kInteger && r->integer == 0) log_debug("remote lock {} was lost", lk);
    }
  }

  // ---- counters shared with the fleet
  void flush() {
    std::lock_guard<std::mutex> lock(flush_mutex);
    const RemoteCounters now = snapshot();
    std::vector<std::uint64_t> before;
    for_each_counter(flushed, [&](const char*, std::uint64_t v) { before.push_back(v); });
    std::vector<std::string> fields;  // name, delta, name, delta...
    std::size_t i = 0;
    for_each_counter(now, [&](const char* name, std::uint64_t v) {
      if (const std::uint64_t delta = v - before[i++]; delta != 0) {
        fields.emplace_back(name);
        fields.push_back(std::to_string(delta));
      }
    });
    if (fields.empty()) return;
    const std::string stats_key = o.key_prefix + "stats";
    std::vector<std::string_view> args{"EVAL", kAddCountersScript, "1", stats_key};
    args.insert(args.end(), fields.begin(), fields.end());
    const auto r = call(args);
    if (r && !r->is_error()) flushed = now;
  }

  // ---- background: lock extension and counter flushes
  void keeper_main() {
    const milliseconds period = std::clamp(o.lock_ttl / 3, milliseconds{10}, kFlushPeriod);
    auto next_flush = Clock::now() + kFlushPeriod;
    std::unique_lock<std::mutex> lock(keeper_mutex);
    while (!stopping) {
      keeper_cv.wait_for(lock, period);
      if (stopping) break;
      lock.unlock();
      // call() turns Redis failures into nullopt; what else can throw here (out of memory) must not
      // leave the thread, which would terminate the process: this round is skipped instead.
      try {
        extend_held();
        if (Clock::now() >= next_flush) {
          flush();
          next_flush = Clock::now() + kFlushPeriod;
        }
      } catch (const std::exception& e) {
        log_warn("remote cache {}: lock extension and counter flush skipped: {}", where, e.what());
      }
      lock.lock();
    }
  }

  std::string new_token() { return fmt::format("{}/{}", token_prefix, token_counter.fetch_add(1)); }

  RemoteOptions o;
  std::string where;
  std::string token_prefix;
  std::atomic<std::uint64_t> token_counter{0};
  AtomicCounters n;

  std::mutex breaker_mutex;
  bool open = false;
  bool probing = false;
  Clock::time_point retry_at;
  std::string last_problem;  // the latest failure or refusal, for push's report
  std::atomic<bool> warned_unreachable{false}, warned_error_reply{false}, warned_rejected{false};

  std::mutex pool_mutex;
  std::vector<std::unique_ptr<RedisConnection>> idle;

  std::mutex held_mutex;
  std::map<std::string, std::string> held;  // lock key -> our token

  std::mutex flush_mutex;
  RemoteCounters flushed;

  std::mutex keeper_mutex;
  std::condition_variable keeper_cv;
  bool stopping = false;
  std::thread keeper;
};

RemoteStore::RemoteStore(RemoteOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {
  impl_->keeper = std::thread([this] { impl_->keeper_main(); });
}

RemoteStore::~RemoteStore() {
  {
    std::lock_guard<std::mutex> lock(impl_->keeper_mutex);
    impl_->stopping = true;
  }
  impl_->keeper_cv.notify_all();
  impl_->keeper.join();
  try {
    impl_->flush();
  } catch (const std::exception& e) {  // a destructor must not throw; the counters are advisory
    log_warn("remote cache {}: final counter flush skipped: {}", impl_->where, e.what());
  }
}

const RemoteOptions& RemoteStore::options() const { return impl_->o; }
std::string RemoteStore::entry_key(const CacheKey& key) const { return impl_->o.key_prefix + key.hex(); }
std::string RemoteStore::lock_key(const CacheKey& key) const { return impl_->o.key_prefix + "lock:" + key.hex(); }
RemoteCounters RemoteStore::counters() const { return impl_->snapshot(); }
void RemoteStore::flush_counters() { impl_->flush(); }

std::optional<CacheEntry> RemoteStore::fetch(const CacheKey& key) {
  Impl::Read r = impl_->read(key, entry_key(key), "");
  if (r.status != Impl::Read::Status::kHit) return std::nullopt;
  impl_->n.hits.fetch_add(1);
  return std::move(r.entry);
}

CacheEntry RemoteStore::get_or_build(const CacheKey& key, const std::function<CacheEntry()>& build, bool* remote_hit) {
  using Status = Impl::Read::Status;
  Impl& s = *impl_;
  *remote_hit = false;
  const std::string ek = entry_key(key);
  const std::string lk = lock_key(key);
  std::string bad;  // fingerprint of a rejected value under ek: the upload replaces exactly that one

  const auto hit = [&](Impl::Read& r) {
    s.n.hits.fetch_add(1);
    *remote_hit = true;
    return std::move(*r.entry);
  };
  // Without the lock (remote unavailable, or waited long enough): build here, upload if possible.
  const auto build_here = [&] {
    CacheEntry entry = build();
    s.upload(entry, ek, bad);
    return entry;
  };

  Impl::Read r = s.read(key, ek, bad);
  if (r.status == Status::kHit) return hit(r);
  if (r.status == Status::kUnavailable) return build_here();
  if (r.status == Status::kRejected) bad = r.fingerprint;
  s.n.misses.fetch_add(1);

  const auto deadline = Clock::now() + s.o.wait_bound;
  milliseconds poll = kFirstPoll;
  std::minstd_rand jitter(static_cast<unsigned>(key.lo ^ static_cast<std::uint64_t>(::getpid())));
  bool waited = false;
  for (;;) {
    const std::string token = s.new_token();
    const Impl::Lock lock = s.try_lock(lk, token);
    if (lock.status == Impl::Lock::Status::kUnavailable) return build_here();
    if (lock.status == Impl::Lock::Status::kAcquired) {
      bool unstorable = false;
      struct Release {
        Impl& s;
        const std::string& lk;
        const std::string& token;
        const bool& unstorable;
        ~Release() { s.release(lk, token, unstorable); }
      } release{s, lk, token, unstorable};
      // Another process may have uploaded between the first read and the lock.
      r = s.read(key, ek, bad);
      if (r.status == Status::kHit) return hit(r);
      if (r.status == Status::kRejected) bad = r.fingerprint;
      CacheEntry entry = build();
      unstorable = s.upload(entry, ek, bad) == Impl::Upload::kRefused;
      return entry;
    }
    if (lock.holder == kUnstorable) return build();  // the server refused this entry moments ago
    if (!waited) {
      waited = true;
      s.n.lock_waits.fetch_add(1);
      log_debug("key {} is being compiled by {}; waiting for its entry", key.hex(), lock.holder);
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      s.n.wait_timeouts.fetch_add(1);
      log_info("waited {} ms for key {} (locked by {}); compiling it here", s.o.wait_bound.count(), key.hex(),
               lock.holder);
      return build_here();
    }
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - now);
    const milliseconds sleep = std::min(left, poll + milliseconds(jitter() % (poll.count() / 2 + 1)));
    std::this_thread::sleep_for(sleep);
    poll = std::min(poll * 2, kMaxPoll);
    r = s.read(key, ek, bad);
    if (r.status == Status::kHit) return hit(r);
    if (r.status == Status::kUnavailable) return build_here();
    if (r.status == Status::kRejected) bad = r.fingerprint;
  }
}

RemoteStore::PushResult RemoteStore::push(const CacheEntry& entry, std::string* problem) {
  using Status = Impl::Read::Status;
  const std::string ek = entry_key(entry.key);
  const Impl::Read r = impl_->read(entry.key, ek, "");
  if (r.status == Status::kHit) return PushResult::kPresent;
  if (r.status != Status::kUnavailable) {
    switch (impl_->upload(entry, ek, r.status == Status::kRejected ? r.fingerprint : std::string())) {
      case Impl::Upload::kStored: return PushResult::kUploaded;
      case Impl::Upload::kPresent: return PushResult::kPresent;
      case Impl::Upload::kRefused:
        if (problem) *problem = fmt::format("{} refused the upload (see the warning above)", impl_->where);
        return PushResult::kFailed;
      case Impl::Upload::kUnavailable: break;
    }
  }
  if (problem) *problem = impl_->problem();
  return PushResult::kFailed;
}

RemoteFleetStats RemoteStore::fleet_stats() {
  const RemoteOptions& o = impl_->o;
  RemoteFleetStats s;
  s.endpoint = impl_->where;
  try {
    RedisConnection c(o.endpoint, o.connect_timeout, o.command_timeout);
    const RedisReply h = c.command({"HGETALL", o.key_prefix + "stats"});
    if (h.is_error()) throw Error(ErrorCode::kCacheIo, fmt::format("HGETALL failed: {}", h.str));
    std::map<std::string, std::uint64_t> fields;
    for (std::size_t i = 0; i + 1 < h.elements.size(); i += 2) {
      fields[h.elements[i].str] = std::strtoull(h.elements[i + 1].str.c_str(), nullptr, 10);
    }
    for_each_counter(s.counters, [&](const char* name, std::uint64_t& v) { v = fields[name]; });
    const std::string pattern = glob_escape(o.key_prefix) + "*";
    std::string cursor = "0";
    do {
      const RedisReply r = c.command({"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"});
      if (r.is_error() || r.elements.size() != 2) throw Error(ErrorCode::kCacheIo, fmt::format("SCAN failed: {}", r.str));
      cursor = r.elements[0].str;
      for (const RedisReply& k : r.elements[1].elements) {
        const std::string_view rest = std::string_view(k.str).substr(o.key_prefix.size());
        if (is_hex32(rest)) ++s.entries;
        else if (rest.starts_with("lock:") && is_hex32(rest.substr(5))) ++s.locks;
      }
    } while (cursor != "0");
    s.reachable = true;
  } catch (const Error& e) {
    s.problem = e.what();
  }
  return s;
}

}  // namespace kiln
