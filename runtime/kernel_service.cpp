#include "kiln/runtime/kernel_service.h"

#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <fstream>
#include <random>
#include <thread>

#include "kiln/jit/arch.h"
#include "kiln/jit/build_request.h"
#include "kiln/jit/compiler.h"
#include "kiln/jit/error.h"
#include "kiln/jit/family.h"
#include "kiln/jit/log.h"
#include "kiln/runtime/device_facts.h"
#include "kiln/runtime/driver.h"
#include "kiln/runtime/manifest.h"
#include "kiln/runtime/stream_device.h"
#include "kiln/runtime/worker_threads.h"

namespace kiln {

namespace {

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

void add_ms(std::atomic<std::uint64_t>& us, double ms) { us.fetch_add(static_cast<std::uint64_t>(ms * 1000.0)); }

}  // namespace

struct KernelService::AtomicCounters {
  std::atomic<std::uint64_t> memory_hits{0}, read_only_hits{0}, disk_hits{0}, remote_hits{0}, compiles{0},
      compile_failures{0}, loads{0}, compile_us{0}, load_us{0};
};

struct KernelService::BuildSlot {
  std::once_flag once;
  std::shared_ptr<const CacheEntry> entry;
};

struct KernelService::LoadSlot {
  std::once_flag once;
  std::unique_ptr<KernelHandle> owned;
  std::atomic<const KernelHandle*> ready{nullptr};  // published after the load completes
};

std::string_view artifact_source_name(ArtifactSource s) {
  switch (s) {
    case ArtifactSource::kMemory: return "memory";
    case ArtifactSource::kReadOnlyLayer: return "read-only layer";
    case ArtifactSource::kDisk: return "disk";
    case ArtifactSource::kRemote: return "remote";
    case ArtifactSource::kCompiled: return "compiled";
  }
  return "?";
}

nlohmann::json ServiceCounters::to_json() const {
  return {{"memory_hits", memory_hits}, {"read_only_hits", read_only_hits}, {"disk_hits", disk_hits},
          {"remote_hits", remote_hits}, {"compiles", compiles},       {"compile_failures", compile_failures},
          {"loads", loads},             {"compile_ms", compile_ms},   {"load_ms", load_ms}};
}

KernelService::KernelService(const Config& config)
    : config_(config),
      store_(std::make_unique<CubinStore>(CubinStore::Options{
          .root = config.cache_dir,
          .read_only_layers = config.read_only_layers,
          .remote = config.remote ? std::make_shared<RemoteStore>(*config.remote) : nullptr})),
      sealed_(config.sealed),
      counters_(std::make_unique<AtomicCounters>()) {}

KernelService::~KernelService() = default;

KernelService& KernelService::global() {
  static KernelService service([] {
    Config c = Config::from_environment();
    set_log_level(c.log_level);
    return c;
  }());
  return service;
}

Artifact KernelService::build(const SemanticKey& key) {
  BuildSlot* slot;
  {
    std::lock_guard<std::mutex> lock(slots_mutex_);
    auto& p = build_slots_[key.str()];
    if (!p) p = std::make_unique<BuildSlot>();
    slot = p.get();
  }
  // call_once: concurrent callers wait for one build; a throwing build leaves the slot open for a retry.
  bool ran = false;
  ArtifactSource source = ArtifactSource::kMemory;
  std::call_once(slot->once, [&] {
    Artifact a = build_uncached(key);
    slot->entry = a.entry;
    source = a.source;
    ran = true;
  });
  if (!ran) counters_->memory_hits.fetch_add(1);
  return Artifact{slot->entry, source};
}

Artifact KernelService::build_uncached(const SemanticKey& key) {
  const BuildRequest request = make_build_request(key);
  bool compiled = false;
  const auto build = [&]() -> CacheEntry {
    if (sealed()) {
      throw Error(ErrorCode::kSealed,
                  "the kernel service is sealed and this key is in no cache layer; warm it before sealing, or "
                  "prebuild it into a layer named in KILN_CACHE_PATH",
                  {.key = key.str()});
    }
    const auto start = std::chrono::steady_clock::now();
    CompileResult result;
    try {
      result = Compiler().compile(request.source, key.arch(), key.str());
    } catch (const Error&) {
      counters_->compile_failures.fetch_add(1);
      throw;
    }
    const double ms = ms_since(start);
    counters_->compiles.fetch_add(1);
    add_ms(counters_->compile_us, ms);
    compiled = true;
    if (config_.dump_dir) {
      std::error_code ec;
      std::filesystem::create_directories(*config_.dump_dir, ec);
      std::ofstream(*config_.dump_dir / (request.cache_key.hex() + ".cu")) << request.source.source;
      std::ofstream(*config_.dump_dir / (request.cache_key.hex() + ".log")) << result.log;
    }
    const NvrtcVersion v = Compiler::nvrtc_version();
    nlohmann::json meta = {{"nvrtc_version", fmt::format("{}.{}", v.major, v.minor)},
                           {"arch", key.arch()},
                           {"options", request.options},
                           {"compile_ms", ms},
                           {"compile_phases_ms",
                            {{"front_end", result.phases.front_end_ms}, {"nvvm", result.phases.nvvm_ms}, {"ptxas", result.phases.ptxas_ms}}},
                           {"source", request.source.source},
                           {"name_expressions", request.source.name_expressions},
                           {"lowered_names", result.lowered_names}};
    return CacheEntry{request.cache_key, key.str(), std::move(meta), std::move(result.cubin)};
  };
  CubinStore::Hit hit = store_->get_or_build(request.cache_key, build, nullptr);
  ArtifactSource source = compiled                      ? ArtifactSource::kCompiled
                          : hit.from_remote              ? ArtifactSource::kRemote
                          : hit.tier == Tier::kReadOnly ? ArtifactSource::kReadOnlyLayer
                                                        : ArtifactSource::kDisk;
  if (source == ArtifactSource::kReadOnlyLayer) counters_->read_only_hits.fetch_add(1);
  if (source == ArtifactSource::kDisk) counters_->disk_hits.fetch_add(1);
  if (source == ArtifactSource::kRemote) counters_->remote_hits.fetch_add(1);
  if (compiled && config_.record_misses) {
    try {
      append_to_manifest(*config_.record_misses, key);
    } catch (const Error& e) {
      log_warn("could not record missed key {} in {}: {}", key.str(), config_.record_misses->string(), e.what());
    }
  }
  return Artifact{std::make_shared<const CacheEntry>(std::move(hit.entry)), source};
}

std::unique_ptr<KernelHandle> KernelService::load(const SemanticKey& key, const CacheEntry& entry, int device) {
  const Driver& d = Driver::get();
  d.require(fmt::format("load kernel {}", key.str()));
  const auto start = std::chrono::steady_clock::now();
  ScopedDeviceContext ctx(device);
  auto handle = std::make_unique<KernelHandle>();
  handle->key = key.str();
  handle->device = device;
  d.check(d.cuModuleLoadData(&handle->module, entry.cubin.data()), "cuModuleLoadData");
  const int max_optin = device_limits(device).smem_per_block_optin;
  for (const auto& name : entry.metadata.at("lowered_names")) {
    KernelFunction f;
    f.lowered_name = name.get<std::string>();
    d.check(d.cuModuleGetFunction(&f.function, handle->module, f.lowered_name.c_str()), "cuModuleGetFunction");
    d.check(d.cuFuncGetAttribute(&f.registers, CU_FUNC_ATTRIBUTE_NUM_REGS, f.function), "cuFuncGetAttribute");
    d.check(d.cuFuncGetAttribute(&f.local_bytes, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, f.function), "cuFuncGetAttribute");
    d.check(d.cuFuncGetAttribute(&f.static_smem_bytes, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, f.function),
            "cuFuncGetAttribute");
    d.check(d.cuFuncGetAttribute(&f.max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f.function),
            "cuFuncGetAttribute");
    // Raised once here so that launches (possibly inside graph capture) never touch attributes.
    f.max_dynamic_smem_bytes = max_optin - f.static_smem_bytes;
    d.check(d.cuFuncSetAttribute(f.function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, f.max_dynamic_smem_bytes),
            "cuFuncSetAttribute");
    handle->functions.push_back(std::move(f));
  }
  counters_->loads.fetch_add(1);
  add_ms(counters_->load_us, ms_since(start));
  return handle;
}

const KernelHandle& KernelService::warm(const SemanticKey& key, int device) {
  LoadSlot* slot;
  {
    std::lock_guard<std::mutex> lock(slots_mutex_);
    auto& p = load_slots_[fmt::format("{}|{}", device, key.str())];
    if (!p) p = std::make_unique<LoadSlot>();
    slot = p.get();
  }
  if (const KernelHandle* h = slot->ready.load(std::memory_order_acquire)) {
    counters_->memory_hits.fetch_add(1);
    return *h;
  }
  std::call_once(slot->once, [&] {
    if (sealed()) {
      throw Error(ErrorCode::kSealed, fmt::format("the kernel service is sealed; warm this key on device {} before sealing", device),
                  {.key = key.str()});
    }
    Driver::get().require(fmt::format("warm kernel {}", key.str()));
    const std::string arch = device_arch(device);
    if (arch != key.arch()) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("key targets {} but device {} is {}; use the key's with_arch(\"{}\")", key.arch(), device,
                              arch, arch),
                  {.key = key.str()});
    }
    // The companions are warmed while this key builds, on threads of their own, so a cold warm takes
    // the longest of the compiles rather than their sum. All of them before this key's load: if one
    // fails, this key's module is not loaded either (a retry loads it once).
    const std::vector<SemanticKey> companion_list = companion_keys(key);
    std::vector<const KernelHandle*> companions(companion_list.size());
    Artifact artifact;
    run_items(1 + companion_list.size(), 1 + companion_list.size(), [&](std::size_t i) {
      if (i == 0) artifact = build(key);
      else companions[i - 1] = &warm(companion_list[i - 1], device);
    });
    slot->owned = load(key, *artifact.entry, device);
    slot->owned->companions = std::move(companions);
    // Before the handle is handed out: a launch that finds the key warm must find these read too.
    read_device_facts(*this, key, device);
    slot->ready.store(slot->owned.get(), std::memory_order_release);
  });
  return *slot->ready.load(std::memory_order_acquire);
}

const KernelHandle& KernelService::warm(const SemanticKey& key, int device, std::uint64_t fingerprint) {
  const KernelHandle& handle = warm(key, device);
  enter_fast_path(fingerprint, device, handle);
  return handle;
}

void KernelService::enter_fast_path(std::uint64_t fingerprint, int device, const KernelHandle& handle) {
  std::unique_lock<std::shared_mutex> lock(fast_mutex_);
  auto [it, inserted] = fast_.emplace(FastKey{fingerprint, device}, &handle);
  if (!inserted && it->second != &handle) {
    throw Error(ErrorCode::kInternal, fmt::format("fingerprint collision between {} and {}", it->second->key, handle.key));
  }
}

void KernelService::warm(const std::vector<SemanticKey>& keys, const std::vector<int>& devices, const WarmProgress& progress) {
  std::vector<std::pair<const SemanticKey*, int>> work;
  for (int device : devices) {
    for (const auto& key : keys) work.emplace_back(&key, device);
  }
  // Per-process order: a fleet starting together then spreads its compiles over the keys (with a
  // remote tier, each process compiles different keys) instead of queueing on the same ones.
  std::shuffle(work.begin(), work.end(), std::minstd_rand(static_cast<unsigned>(::getpid())));
  std::mutex progress_mutex;
  std::size_t done = 0;
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  run_items(work.size(), config_.threads > 0 ? config_.threads : hw, [&](std::size_t i) {
    const auto start = std::chrono::steady_clock::now();
    std::string problem;
    std::exception_ptr error;
    try {
      warm(*work[i].first, work[i].second);
    } catch (const std::exception& e) {
      problem = e.what();
      error = std::current_exception();
    } catch (...) {
      problem = "an exception that is not a std::exception";
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(progress_mutex);
      ++done;
      if (progress) progress(done, work.size(), *work[i].first, work[i].second, ms_since(start), problem);
    }
    if (error) std::rethrow_exception(error);  // run_items rethrows the first once every item has run
  });
}

const KernelHandle* KernelService::find_loaded(const SemanticKey& key, int device) {
  std::lock_guard<std::mutex> lock(slots_mutex_);
  auto it = load_slots_.find(fmt::format("{}|{}", device, key.str()));
  return it == load_slots_.end() ? nullptr : it->second->ready.load(std::memory_order_acquire);
}

const KernelHandle* KernelService::find(std::uint64_t fingerprint, int device) const noexcept {
  std::shared_lock<std::shared_mutex> lock(fast_mutex_);
  auto it = fast_.find(FastKey{fingerprint, device});
  return it == fast_.end() ? nullptr : it->second;
}

const KernelHandle& KernelService::acquire(std::uint64_t fingerprint, const std::function<SemanticKey()>& make_key,
                                           CUstream stream, int device) {
  if (const KernelHandle* h = find(fingerprint, device)) return *h;
  const SemanticKey key = make_key();
  const Driver& d = Driver::get();
  d.require(fmt::format("launch kernel {}", key.str()));
  if (stream_capturing(stream) && find_loaded(key, device) == nullptr) {
    throw Error(ErrorCode::kNotWarm,
                fmt::format("the stream is capturing a CUDA graph and this kernel is not warm on device {}; nothing "
                            "was compiled. Warm the key before capture (warm function or kiln warm --manifest)",
                            device),
                {.key = key.str()});
  }
  return warm(key, device, fingerprint);
}

const KernelService::DeviceInfo& KernelService::device_info(int device) {
  const bool cached = device >= 0 && device < kMaxDevices;
  if (cached) {
    if (const DeviceInfo* info = device_cache_[device].load(std::memory_order_acquire)) return *info;
  }
  std::lock_guard<std::mutex> lock(device_mutex_);
  auto it = devices_.find(device);
  if (it == devices_.end()) {
    const Driver& d = Driver::get();
    d.require(fmt::format("query device {}", device));
    CUdevice dev = 0;
    d.check(d.cuDeviceGet(&dev, device), "cuDeviceGet");
    const auto attribute = [&](CUdevice_attribute a) {
      int v = 0;
      d.check(d.cuDeviceGetAttribute(&v, a, dev), "cuDeviceGetAttribute");
      return v;
    };
    auto info = std::make_unique<DeviceInfo>();
    info->arch = arch_for_compute_capability(attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                                             attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR));
    info->limits.sm_count = attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    info->limits.smem_per_sm = attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
    info->limits.smem_per_block_optin = attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
    info->limits.smem_reserved_per_block = attribute(CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK);
    it = devices_.emplace(device, std::move(info)).first;
    if (cached) device_cache_[device].store(it->second.get(), std::memory_order_release);
  }
  return *it->second;
}

const std::string& KernelService::device_arch(int device) { return device_info(device).arch; }

const DeviceLimits& KernelService::device_limits(int device) { return device_info(device).limits; }

ServiceCounters KernelService::counters() const {
  ServiceCounters c;
  c.memory_hits = counters_->memory_hits.load();
  c.read_only_hits = counters_->read_only_hits.load();
  c.disk_hits = counters_->disk_hits.load();
  c.remote_hits = counters_->remote_hits.load();
  c.compiles = counters_->compiles.load();
  c.compile_failures = counters_->compile_failures.load();
  c.loads = counters_->loads.load();
  c.compile_ms = counters_->compile_us.load() / 1000.0;
  c.load_ms = counters_->load_us.load() / 1000.0;
  return c;
}

}  // namespace kiln
