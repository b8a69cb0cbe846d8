#pragma once
// CubinStore: the content-addressed on-disk cubin cache.
//
// Layout of a layer:  entries/<2 hex>/<32 hex>.kiln   (one framed CacheEntry per file)
// plus, in the writable root only:  locks/<32 hex>.lock   quarantine/   tmp/
// Read-only layers (prebuilt caches) are searched first, in order, then the writable root.
//
// Any entry that cannot be read, fails to decode or echoes another key is a miss: in the root it is
// moved to quarantine/ (with a .reason sidecar) and rebuilt; in a read-only layer it is skipped with
// a warning. An unwritable root (read-only, full, missing) is not an error: the store warns once and
// get_or_build keeps handing out built entries from memory. Thread-safe; safe across processes.
// With a remote tier, get_or_build asks it (under the key's local lock) before building.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/cache/cache_entry.h"
#include "kiln/cache/store_reports.h"
#include "kiln/jit/cache_key.h"

namespace kiln {

class RemoteStore;

class CubinStore {
 public:
  struct Options {
    std::filesystem::path root;  // writable layer; empty = no writable layer
    std::vector<std::filesystem::path> read_only_layers;
    // Test seam, called at named points of publish: "tmp_opened", "tmp_half_written",
    // "after_tmp_write", "after_tmp_fsync", "after_rename", "after_dir_fsync". A hook that throws
    // std::system_error makes that step fail with its errno (e.g. EROFS, ENOSPC); a hook may also
    // kill the process to simulate a crash. Library code never sets it.
    std::function<void(std::string_view point)> fault_hook;
    // Temp files older than this are left by a killed publisher; removed when the store opens.
    std::chrono::seconds stale_tmp_age{3600};
    // The fleet tier (remote_store.h), asked after every local layer has missed; null: none.
    std::shared_ptr<RemoteStore> remote;
  };

  struct Hit {
    CacheEntry entry;
    Tier tier = Tier::kWritable;
    std::filesystem::path file;  // empty for Tier::kMemory
    bool from_remote = false;    // get_or_build took it from the remote tier (then published it here)
  };

  // Creates the root's directories if it can; never throws for an unwritable root.
  explicit CubinStore(Options options);

  std::optional<Hit> lookup(const CacheKey& key);

  // Atomically writes the entry into the root. Returns false (after one warning per store) if the
  // root is not writable; later calls then return false at once. Throws only Error(kInvalidArgument)
  // for an entry that cannot be encoded.
  bool publish(const CacheEntry& entry);

  // lookup; on a miss take the key's cross-process lock, look up again, then ask the remote tier,
  // and only then build; publish what came from either. `build` must return an entry for `key`.
  // If it throws, the locks are released and the exception propagates. *built (optional) says
  // whether this call ran build.
  Hit get_or_build(const CacheKey& key, const std::function<CacheEntry()>& build, bool* built = nullptr);

  std::vector<ListedEntry> list() const;
  // Fully re-reads every entry of every layer; quarantines bad ones in the root.
  VerifyReport verify();
  // Removes quarantined files, then least-recently-used root entries until the root's entries
  // total <= max_bytes. Never touches read-only layers.
  PruneReport prune(std::uint64_t max_bytes);
  StoreStats stats() const;

  bool writable() const { return writable_.load(std::memory_order_relaxed); }
  // Why the root could not be set up when the store opened (empty if it could).
  const std::string& open_failure() const { return open_failure_; }
  const Options& options() const { return options_; }

  static std::filesystem::path entry_path(const std::filesystem::path& layer, const CacheKey& key);
  std::filesystem::path lock_path(const CacheKey& key) const;

 private:
  struct ReadResult;
  ReadResult read_entry_file(const std::filesystem::path& file, const CacheKey& key, bool touch) const;
  void quarantine(const std::filesystem::path& file, const ReadResult& bad);
  bool first_warning_for(const std::filesystem::path& file);
  void warn_read_only_bad(const std::filesystem::path& file, const std::string& reason);
  void disable_writes(const std::string& why);
  void fault(std::string_view point) const;
  void remove_stale_temp_files() const;

  Options options_;
  std::atomic<bool> writable_{false};
  std::atomic<bool> warned_unwritable_{false};
  std::string open_failure_;  // why the root could not be set up; fixed after construction

  std::mutex warned_mutex_;
  std::set<std::filesystem::path> warned_files_;  // bad files that cannot be moved, already warned about
};

}  // namespace kiln
