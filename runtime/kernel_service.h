#pragma once
// semantic key -> warm handle, through memory -> read-only layers -> writable disk -> remote tier
// (when configured) -> compile -> publish -> load. Knows nothing about any kernel family.
#include <cuda.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/cache/cubin_store.h"
#include "kiln/jit/semantic_key.h"
#include "kiln/runtime/config.h"
#include "kiln/runtime/device_limits.h"
#include "kiln/runtime/kernel_handle.h"

namespace kiln {

enum class ArtifactSource { kMemory, kReadOnlyLayer, kDisk, kRemote, kCompiled };
std::string_view artifact_source_name(ArtifactSource s);

struct Artifact {
  std::shared_ptr<const CacheEntry> entry;
  ArtifactSource source = ArtifactSource::kMemory;
};

struct ServiceCounters {
  std::uint64_t memory_hits = 0;      // artifact or handle already in this process
  std::uint64_t read_only_hits = 0;   // found in a prebuilt (read-only) layer
  std::uint64_t disk_hits = 0;        // found in the writable cache
  std::uint64_t remote_hits = 0;      // found in the remote tier (then published to the writable cache)
  std::uint64_t compiles = 0;
  std::uint64_t compile_failures = 0;
  std::uint64_t loads = 0;            // modules loaded onto a device
  double compile_ms = 0;
  double load_ms = 0;

  nlohmann::json to_json() const;
};

class KernelService {
 public:
  explicit KernelService(const Config& config);
  ~KernelService();
  KernelService(const KernelService&) = delete;
  KernelService& operator=(const KernelService&) = delete;

  // The process-wide service, configured from the environment on first use. Launchers and warm
  // functions use it unless they are handed another service.
  static KernelService& global();

  // Cubin for `key` (no GPU): memory, read-only layers, disk, else compile and publish.
  // Concurrent calls for one key compile once (in this process and, through the store's lock, across
  // processes); different keys compile in parallel. Throws kSealed when sealed and not cached.
  Artifact build(const SemanticKey& key);

  // Loads `key` on `device` (building first when needed) and sets its attributes; warms the key's
  // companions (Family::companions) on the device too, on threads of their own while the key builds,
  // and hands them out with it; reads the device facts its family's launches need (device_facts.h).
  const KernelHandle& warm(const SemanticKey& key, int device);
  // The same, and enters the handle in acquire()'s fast-path table under `fingerprint`, so that the
  // first launch after warm-up (often inside graph capture) is one hash lookup.
  const KernelHandle& warm(const SemanticKey& key, int device, std::uint64_t fingerprint);

  // Warms every key on every device over a thread pool; rethrows the first failure after all finish.
  // `progress` (optional; must not throw) is called under a lock as each (key, device) finishes:
  // done, total, key, device, ms, and the error's message ("" when it warmed).
  using WarmProgress =
      std::function<void(std::size_t, std::size_t, const SemanticKey&, int, double, const std::string&)>;
  void warm(const std::vector<SemanticKey>& keys, const std::vector<int>& devices, const WarmProgress& progress = {});

  // The hot path. `fingerprint` identifies the key cheaply (a family hashes its POD policy and arch);
  // on a miss `make_key` builds the full key. `device` is the stream's (launchers know it already). If the kernel is not warm and `stream` is capturing,
  // throws kNotWarm naming the key and compiles nothing; when sealed, throws kSealed.
  const KernelHandle& acquire(std::uint64_t fingerprint, const std::function<SemanticKey()>& make_key, CUstream stream,
                              int device);

  // Lookup only: nullptr when `fingerprint` is not warm on `device`.
  const KernelHandle* find(std::uint64_t fingerprint, int device) const noexcept;

  // Exact arch and limits of a device, read from the driver on first use; later calls are one
  // atomic load (launchers ask on every call).
  const std::string& device_arch(int device);
  const DeviceLimits& device_limits(int device);
  int device_sm_count(int device) { return device_limits(device).sm_count; }

  void seal() { sealed_.store(true); }
  void unseal() { sealed_.store(false); }
  bool sealed() const { return sealed_.load(); }

  ServiceCounters counters() const;
  CubinStore& store() { return *store_; }
  RemoteStore* remote() { return store_->options().remote.get(); }  // null without a remote tier
  const Config& config() const { return config_; }

 private:
  struct BuildSlot;
  struct LoadSlot;

  Artifact build_uncached(const SemanticKey& key);
  // A handle already loaded by warm(), or nullptr (never loads).
  const KernelHandle* find_loaded(const SemanticKey& key, int device);
  std::unique_ptr<KernelHandle> load(const SemanticKey& key, const CacheEntry& entry, int device);

  Config config_;
  std::unique_ptr<CubinStore> store_;
  std::atomic<bool> sealed_{false};

  std::mutex slots_mutex_;
  std::unordered_map<std::string, std::unique_ptr<BuildSlot>> build_slots_;
  std::unordered_map<std::string, std::unique_ptr<LoadSlot>> load_slots_;  // "device|key"

  struct FastKey {
    std::uint64_t fingerprint;
    int device;
    friend bool operator==(const FastKey&, const FastKey&) = default;
  };
  struct FastKeyHash {
    std::size_t operator()(const FastKey& k) const noexcept {
      return static_cast<std::size_t>(k.fingerprint ^ (static_cast<std::uint64_t>(k.device) * 0x9e3779b97f4a7c15ull));
    }
  };
  mutable std::shared_mutex fast_mutex_;
  std::unordered_map<FastKey, const KernelHandle*, FastKeyHash> fast_;

  struct DeviceInfo {
    std::string arch;
    DeviceLimits limits;
  };
  const DeviceInfo& device_info(int device);
  void enter_fast_path(std::uint64_t fingerprint, int device, const KernelHandle& handle);

  static constexpr int kMaxDevices = 64;
  std::array<std::atomic<const DeviceInfo*>, kMaxDevices> device_cache_{};
  std::mutex device_mutex_;
  std::unordered_map<int, std::unique_ptr<const DeviceInfo>> devices_;

  struct AtomicCounters;
  std::unique_ptr<AtomicCounters> counters_;
};

}  // namespace kiln
