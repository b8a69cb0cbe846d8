#pragma once
// RemoteStore: the fleet tier on Redis, asked after every local tier has missed and before a
// compile, so that a fleet compiles each key once.
//
// Keys (prefix configurable): <prefix><32 hex> holds the entry (remote_value.h), written with
// SET NX and never overwritten, except to replace a value that failed its checks;
// <prefix>lock:<32 hex> is the fleet-wide compile lock (SET NX PX with an owner token, extended
// while the compile runs, deleted only by its owner); <prefix>stats is a hash of fleet-wide
// counters that each process adds its own to.
//
// Faults never fail a caller: every Redis call is bounded by the connect and command timeouts; a
// failed call opens a circuit breaker (no Redis call until `retry_after` has passed, then one
// probe), warns once per store, and the caller is served from its local tiers or a local compile.
// Thread-safe.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "kiln/cache/cache_entry.h"
#include "kiln/cache/redis_client.h"
#include "kiln/jit/cache_key.h"

namespace kiln {

struct RemoteOptions {
  RedisEndpoint endpoint;
  std::string key_prefix = "kiln:";
  std::chrono::milliseconds connect_timeout{250};
  std::chrono::milliseconds command_timeout{500};
  std::chrono::milliseconds lock_ttl{15000};     // a dead lock holder releases its key after this
  std::chrono::milliseconds wait_bound{60000};   // longest wait for another process's compile
  std::chrono::milliseconds retry_after{5000};   // circuit breaker: quiet period after a failure
  std::string secret;                            // HMAC-SHA256 key; empty: no signing, no check
  std::uint64_t max_entry_bytes = std::uint64_t{256} << 20;  // larger values are never transferred
};

struct RemoteCounters {
  std::uint64_t hits = 0;           // entries served from the remote tier
  std::uint64_t misses = 0;         // keys not found there at first asking
  std::uint64_t uploads = 0;        // entries this process stored (new, or replacing a bad one)
  std::uint64_t rejected = 0;       // values that failed their checks (never loaded)
  std::uint64_t lock_waits = 0;     // keys waited for while another process compiled them
  std::uint64_t wait_timeouts = 0;  // waits that reached the bound (then compiled here)
  std::uint64_t errors = 0;         // failed Redis calls (transport, timeout or error reply)

  nlohmann::json to_json() const;
};

// `kiln stats`: what the Redis server holds for this prefix, and the fleet's summed counters.
struct RemoteFleetStats {
  std::string endpoint;
  bool reachable = false;
  std::string problem;  // why not reachable
  std::uint64_t entries = 0;
  std::uint64_t locks = 0;
  RemoteCounters counters;  // every process's flushed counters, summed

  nlohmann::json to_json() const;
};

class RemoteStore {
 public:
  explicit RemoteStore(RemoteOptions options);
  // Flushes this process's counters to the fleet hash (bounded by the command timeout).
  ~RemoteStore();
  RemoteStore(const RemoteStore&) = delete;
  RemoteStore& operator=(const RemoteStore&) = delete;

  // For a key that no local tier holds: the remote entry if a valid one is there (*remote_hit);
  // else take the fleet-wide lock and build (another process holding it: wait for its entry, up
  // to wait_bound, then build here), then upload. A remote fault makes this call build() at once.
  // Exceptions from build() propagate (the lock is released first); nothing else throws.
  CacheEntry get_or_build(const CacheKey& key, const std::function<CacheEntry()>& build, bool* remote_hit);

  // Uploads an entry that is not in Redis yet (prebuild --push). *problem says why on kFailed.
  enum class PushResult { kUploaded, kPresent, kFailed };
  PushResult push(const CacheEntry& entry, std::string* problem);

  // One read: the verified entry, or nullopt when absent, rejected (counted) or unreachable.
  std::optional<CacheEntry> fetch(const CacheKey& key);

  RemoteCounters counters() const;
  // Reads the server directly (not through the breaker); never throws.
  RemoteFleetStats fleet_stats();
  // Adds this process's counters since the last flush to the fleet hash now.
  void flush_counters();

  const RemoteOptions& options() const;
  std::string entry_key(const CacheKey& key) const;
  std::string lock_key(const CacheKey& key) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
