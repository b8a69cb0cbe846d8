// stress_warm: one worker process of the kill stress test (tests/stress/stress_supervisor.cpp).
//
// N threads share one KernelService and, until a deadline or a stop file, pick random keys from
// the worker's key set and either build them through the service (memory -> disk -> compile ->
// publish) or read them straight from the store (disk read + full integrity check), comparing the
// bytes with what this process got before. The supervisor SIGKILLs workers at random, so every
// report is one write() on an O_APPEND log (atomic for these sizes): a killed worker loses at most
// the events since its last report, never corrupts another worker's line.
//
// Usage: stress_warm --cache DIR --id N --log FILE --keys 0,3,5 [--then-keys 1,2 --switch-file F]
//                    [--threads 4] [--seconds S] [--stop-file F] [--lookup-ratio 3] [--report-ms 200]
//                    [--fsize-limit BYTES] [--dump-dir DIR] [--pause-us N]
// --fsize-limit sets RLIMIT_FSIZE (SIGXFSZ ignored) so writes past BYTES fail with EFBIG: the
// quota-like stand-in for a full disk where a small tmpfs cannot be mounted.
// Keys are indices into stress_keys() (tests/stress/stress_keys.h).
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "kiln/jit/build_request.h"
#include "kiln/jit/error.h"
#include "kiln/jit/log.h"
#include "kiln/runtime/config.h"
#include "kiln/runtime/families.h"
#include "kiln/runtime/kernel_service.h"
#include "stress_keys.h"

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

struct Args {
  std::string cache, log, stop_file, switch_file, dump_dir;
  int id = 0;
  int threads = 4;
  double seconds = 60;
  int lookup_ratio = 3;  // store lookups per service build
  int report_ms = 200;
  int pause_us = 0;  // sleep after each operation, so lookups do not starve a compile of CPU
  long long fsize_limit = 0;
  std::vector<int> keys, then_keys;
};

std::vector<int> parse_indices(const std::string& s) {
  std::vector<int> out;
  std::size_t pos = 0;
  while (pos < s.size()) {
    const std::size_t end = std::min(s.find(',', pos), s.size());
    out.push_back(std::stoi(s.substr(pos, end - pos)));
    pos = end + 1;
  }
  return out;
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string opt = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "stress_warm: %s needs a value\n", opt.c_str());
      std::exit(2);
    }
    const std::string v = argv[++i];
    if (opt == "--cache") a.cache = v;
    else if (opt == "--log") a.log = v;
    else if (opt == "--id") a.id = std::stoi(v);
    else if (opt == "--threads") a.threads = std::stoi(v);
    else if (opt == "--seconds") a.seconds = std::stod(v);
    else if (opt == "--stop-file") a.stop_file = v;
    else if (opt == "--switch-file") a.switch_file = v;
    else if (opt == "--lookup-ratio") a.lookup_ratio = std::stoi(v);
    else if (opt == "--dump-dir") a.dump_dir = v;
    else if (opt == "--report-ms") a.report_ms = std::stoi(v);
    else if (opt == "--pause-us") a.pause_us = std::stoi(v);
    else if (opt == "--fsize-limit") a.fsize_limit = std::stoll(v);
    else if (opt == "--keys") a.keys = parse_indices(v);
    else if (opt == "--then-keys") a.then_keys = parse_indices(v);
    else {
      std::fprintf(stderr, "stress_warm: unknown option %s\n", opt.c_str());
      std::exit(2);
    }
  }
  if (a.cache.empty() || a.log.empty() || a.keys.empty()) {
    std::fprintf(stderr, "stress_warm: --cache, --log and --keys are required\n");
    std::exit(2);
  }
  return a;
}

bool exists(const std::string& path) {
  struct stat st {};
  return !path.empty() && ::stat(path.c_str(), &st) == 0;
}

std::string hash_hex(const std::string& bytes) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(XXH3_64bits(bytes.data(), bytes.size())));
  return buf;
}

class Worker {
 public:
  explicit Worker(Args args) : args_(std::move(args)) {
    kiln::Config config;
    config.cache_dir = args_.cache;
    config.log_level = kiln::LogLevel::kWarn;
    // KILN_DUMP_SOURCE writes <cache key>.log after every finished compile, before the publish:
    // the supervisor counts those files' writes, which a SIGKILL cannot hide.
    if (!args_.dump_dir.empty()) config.dump_dir = args_.dump_dir;
    kiln::set_log_level(config.log_level);
    service_ = std::make_unique<kiln::KernelService>(config);
    keys_ = kiln::stress::stress_keys();
    for (const auto& k : keys_) cache_keys_.push_back(kiln::make_build_request(k).cache_key);
    log_fd_ = ::open(args_.log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd_ < 0) {
      std::fprintf(stderr, "stress_warm: cannot open log %s: %s\n", args_.log.c_str(), std::strerror(errno));
      std::exit(2);
    }
  }

  int run() {
    report("start");
    const auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(args_.seconds));
    std::vector<std::thread> pool;
    for (int t = 0; t < args_.threads; ++t) {
      pool.emplace_back([this, t, deadline] { thread_main(t, deadline); });
    }
    // Periodic reports bound what a SIGKILL can take away from the tallies.
    while (!done_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(args_.report_ms));
      if (Clock::now() >= deadline || exists(args_.stop_file)) done_ = true;
      report("periodic");
    }
    for (auto& t : pool) t.join();
    report("exit");
    return failures_.load() == 0 ? 0 : 1;
  }

 private:
  const std::vector<int>& current_keys() const {
    if (!args_.then_keys.empty() && exists(args_.switch_file)) return args_.then_keys;
    return args_.keys;
  }

  void thread_main(int t, Clock::time_point deadline) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(::getpid()) * 1315423911u + static_cast<std::uint64_t>(t));
    while (!done_.load() && Clock::now() < deadline) {
      const std::vector<int>& set = current_keys();
      const int k = set[rng() % set.size()];
      try {
        if (rng() % static_cast<std::uint64_t>(args_.lookup_ratio + 1) == 0 || !have_bytes(k)) {
          build(k);
        } else {
          lookup(k);
        }
      } catch (const kiln::Error& e) {
        fail(fmt_error(k, e.what()));
      } catch (const std::exception& e) {
        fail(fmt_error(k, e.what()));
      }
      if (args_.pause_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(args_.pause_us));
    }
  }

  void build(int k) {
    const kiln::Artifact a = service_->build(keys_[k]);
    builds_.fetch_add(1);
    remember(k, a.entry->cubin);
    if (a.source == kiln::ArtifactSource::kCompiled) {
      // Logged right away (build() returns only after the publish attempt), so a compile whose
      // publish succeeded is lost from the log only if the kill lands in this narrow window.
      compiles_.fetch_add(1);
      json line = {{"event", "compiled"}, {"id", args_.id}, {"pid", ::getpid()}, {"key", k},
                   {"persisted", service_->store().writable()}};
      write_line(line);
    }
  }

  void lookup(int k) {
    auto hit = service_->store().lookup(cache_keys_[k]);
    if (!hit) {
      // Not on disk: fine before anyone published it, or when the cache is unwritable.
      lookup_misses_.fetch_add(1);
      return;
    }
    lookup_hits_.fetch_add(1);
    remember(k, hit->entry.cubin);
  }

  bool have_bytes(int k) {
    std::lock_guard<std::mutex> lock(mutex_);
    return hashes_.count(k) != 0;
  }

  // Every copy of a key's cubin this process sees must be byte-identical (NVRTC is deterministic
  // and the store never hands out a damaged or misfiled entry).
  void remember(int k, const std::string& cubin) {
    const std::string h = hash_hex(cubin);
    std::lock_guard<std::mutex> lock(mutex_);
    auto [it, inserted] = hashes_.emplace(k, h);
    if (!inserted && it->second != h) {
      failures_.fetch_add(1);
      std::fprintf(stderr, "stress_warm %d: key %d returned cubin %s, earlier %s\n", args_.id, k, h.c_str(),
                   it->second.c_str());
    }
  }

  static std::string fmt_error(int k, const char* what) { return "key " + std::to_string(k) + ": " + what; }

  void fail(const std::string& what) {
    failures_.fetch_add(1);
    std::fprintf(stderr, "stress_warm %d: %s\n", args_.id, what.c_str());
    done_ = true;
  }

  void report(const char* event) {
    const kiln::ServiceCounters c = service_->counters();
    json hashes = json::object();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const auto& [k, h] : hashes_) hashes[std::to_string(k)] = h;
    }
    write_line({{"event", event},
                {"id", args_.id},
                {"pid", ::getpid()},
                {"compiles", c.compiles},
                {"disk_hits", c.disk_hits},
                {"memory_hits", c.memory_hits},
                {"builds", builds_.load()},
                {"lookup_hits", lookup_hits_.load()},
                {"lookup_misses", lookup_misses_.load()},
                {"failures", failures_.load()},
                {"writable", service_->store().writable()},
                {"hashes", hashes}});
  }

  void write_line(const json& j) {
    const std::string line = j.dump() + "\n";
    // One write on an O_APPEND descriptor: lines of concurrent writers never interleave.
    [[maybe_unused]] const ssize_t n = ::write(log_fd_, line.data(), line.size());
  }

  Args args_;
  std::unique_ptr<kiln::KernelService> service_;
  std::vector<kiln::SemanticKey> keys_;
  std::vector<kiln::CacheKey> cache_keys_;
  int log_fd_ = -1;
  std::atomic<bool> done_{false};
  std::atomic<std::uint64_t> builds_{0}, compiles_{0}, lookup_hits_{0}, lookup_misses_{0}, failures_{0};
  std::mutex mutex_;
  std::map<int, std::string> hashes_;
};

}  // namespace

int main(int argc, char** argv) {
  kiln::register_builtin_families();
  Args args = parse_args(argc, argv);
  if (args.fsize_limit > 0) {
    std::signal(SIGXFSZ, SIG_IGN);  // a write past the limit then fails with EFBIG instead of killing us
    const rlimit lim{static_cast<rlim_t>(args.fsize_limit), static_cast<rlim_t>(args.fsize_limit)};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) {
      std::perror("stress_warm: setrlimit(RLIMIT_FSIZE)");
      return 2;
    }
  }
  Worker worker(std::move(args));
  return worker.run();
}
