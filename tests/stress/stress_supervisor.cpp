// stress_supervisor: the `stress` ctest. Three phases against real processes (stress_warm):
//
//  1. kill: 16 workers x 4 threads warm and look up overlapping subsets of 16 keys (writer, MLA,
//     sparse) in one cache directory while the supervisor SIGKILLs a random worker every 0.1-0.6 s
//     (0.05-0.2 s during the first 6 s, while the cold keys compile) and restarts it.
//     Afterwards: `kiln verify` finds no bad entry, every lock file can be flock'ed with LOCK_NB,
//     every copy of a key's cubin any worker saw is byte-identical, and no key was published
//     twice. Publishes are counted with inotify (a temp file renamed into entries/), so a worker
//     killed right after its rename is still counted: the count does not depend on the workers'
//     own reports surviving the kill. Finished compiles are counted the same way (KILN_DUMP_SOURCE
//     writes <key>.log after each compile, before publish); a worker killed between its compile
//     and its publish leaves a compile without a publish, and the next lock holder compiles again,
//     so compiles may exceed publishes, but publishes may never exceed one per key.
//  2. read-only: workers publish two keys, then the cache directory becomes read-only (a
//     read-only bind mount over itself; where mounting is not allowed, the root is replaced by a
//     file) and they switch to two new keys: these are compiled and served from memory, each
//     worker warns exactly once, lookups of the old keys keep working.
//  3. full disk: the cache directory is a 64 KiB tmpfs (where mounting is not allowed:
//     RLIMIT_FSIZE 16 KiB, smaller than one entry) and workers warm five ~20 KiB keys: the ones
//     that fit are published, the rest served from memory, each worker that hit ENOSPC warns
//     exactly once, no partial entry or temp file is left.
// Prints the figures (processes, kills, entries checked, compiles, publishes, duration) and, with
// --report FILE, writes them as JSON. Exit 0 when every check passes.
//
// Usage: stress_supervisor --worker PATH --kiln PATH [--seconds 40] [--processes 16] [--threads 4]
//                          [--report FILE] [--keep]
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "kiln/jit/build_request.h"
#include "kiln/runtime/families.h"
#include "stress_keys.h"
#include "tests/support/supervisor_checks.h"

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace kiln::testing::supervisor;

namespace {

constexpr std::string_view kMemoryWarning = "kiln keeps compiled kernels in memory only";

struct Options {
  std::string worker, kiln, report;
  double seconds = 40;
  int processes = 16;
  int threads = 4;
  bool keep = false;
};

std::string fmt_count(const std::string& what, std::size_t n) { return std::to_string(n) + " " + what; }

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void touch(const fs::path& p) { std::ofstream(p) << "x\n"; }

// fork + exec with stdout and stderr appended to `err_file`.
pid_t spawn(const std::vector<std::string>& argv, const fs::path& err_file) {
  const pid_t pid = ::fork();
  if (pid < 0) {
    std::perror("fork");
    std::exit(3);
  }
  if (pid == 0) {
    const int fd = ::open(err_file.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::close(fd);
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    std::perror("execv");
    ::_exit(127);
  }
  return pid;
}

// KILN_STRESS_NO_MOUNT=1 forces the fallbacks used where mount(8) is not permitted (containers).
bool mounts_allowed() { return std::getenv("KILN_STRESS_NO_MOUNT") == nullptr; }

int run_shell(const std::string& cmd) {
  const int rc = std::system((cmd + " >/dev/null 2>&1").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// `kiln verify --cache DIR --json`: (exit code, entries checked, bad entries).
struct VerifyResult {
  int rc = -1;
  std::uint64_t checked = 0;
  std::size_t bad = 0;
};
VerifyResult kiln_verify(const Options& o, const fs::path& cache) {
  VerifyResult r;
  const std::string cmd = o.kiln + " verify --json --cache " + cache.string() + " 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  std::string out;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = ::pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  const json j = json::parse(out, nullptr, /*allow_exceptions=*/false);
  if (j.is_object()) {
    r.checked = j.value("checked", std::uint64_t{0});
    r.bad = j.contains("bad") ? j["bad"].size() : 0;
  } else {
    r.rc = -2;
  }
  return r;
}

// Every lock file must be free once all workers are gone: the kernel drops a dead holder's flock.
std::pair<std::size_t, std::size_t> check_locks(const fs::path& cache) {
  std::size_t total = 0, stuck = 0;
  std::error_code ec;
  for (fs::directory_iterator it(cache / "locks", ec), end; !ec && it != end; it.increment(ec)) {
    ++total;
    const int fd = ::open(it->path().c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0 || ::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      ++stuck;
      std::printf("  lock still held or unopenable: %s\n", it->path().c_str());
    }
    if (fd >= 0) ::close(fd);
  }
  return {total, stuck};
}

std::size_t count_files(const fs::path& dir) {
  std::size_t n = 0;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) ++n;
  return n;
}

// Workers' JSON-lines logs: the last report of each pid, compile events and every cubin hash seen.
struct LogSummary {
  std::map<long, json> last_report;       // pid -> last counters line
  std::map<long, int> id_of_pid;
  std::map<int, std::size_t> persisted_compiles;  // key -> compile events while the store was writable
  std::map<int, std::size_t> compile_events;      // key -> all compile events
  std::map<int, std::set<std::string>> hashes;    // key -> cubin hashes seen by any worker
  std::size_t lines = 0, bad_lines = 0;
};

LogSummary read_logs(const fs::path& dir) {
  LogSummary s;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().extension() != ".log") continue;
    std::ifstream in(it->path());
    for (std::string line; std::getline(in, line);) {
      ++s.lines;
      const json j = json::parse(line, nullptr, false);
      if (!j.is_object() || !j.contains("event")) {
        ++s.bad_lines;  // impossible by construction (one write per line); counted to prove it
        continue;
      }
      const long pid = j.value("pid", 0L);
      s.id_of_pid[pid] = j.value("id", -1);
      if (j["event"] == "compiled") {
        const int k = j.value("key", -1);
        ++s.compile_events[k];
        if (j.value("persisted", false)) ++s.persisted_compiles[k];
        continue;
      }
      s.last_report[pid] = j;
      for (const auto& [k, h] : j["hashes"].items()) s.hashes[std::stoi(k)].insert(h.get<std::string>());
    }
  }
  return s;
}

// Counts publishes (a tmp/ file renamed into an entries/ shard, paired by inotify cookie) and
// finished compiles (close-after-write of <key>.log in the dump directory).
class PublishWatch {
 public:
  PublishWatch(const fs::path& cache, const fs::path& dump, const std::vector<std::string>& key_hexes) {
    fd_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fd_ < 0) {
      std::perror("inotify_init1");
      return;
    }
    // Shards exist before the workers start, so the watches see the first publish too.
    fs::create_directories(cache / "tmp");
    tmp_wd_ = ::inotify_add_watch(fd_, (cache / "tmp").c_str(), IN_MOVED_FROM);
    for (const auto& hex : key_hexes) {
      const fs::path shard = cache / "entries" / hex.substr(0, 2);
      fs::create_directories(shard);
      const int wd = ::inotify_add_watch(fd_, shard.c_str(), IN_MOVED_TO);
      if (wd >= 0) shard_wds_.insert(wd);
    }
    fs::create_directories(dump);
    dump_wd_ = ::inotify_add_watch(fd_, dump.c_str(), IN_CLOSE_WRITE);
  }
  ~PublishWatch() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool ok() const { return fd_ >= 0 && tmp_wd_ >= 0 && dump_wd_ >= 0 && !overflow_; }

  void drain() {
    if (fd_ < 0) return;
    alignas(inotify_event) char buf[64 * 1024];
    for (;;) {
      const ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n <= 0) return;
      for (char* p = buf; p < buf + n;) {
        const auto* ev = reinterpret_cast<const inotify_event*>(p);
        const std::string name = ev->len ? ev->name : "";
        if (ev->mask & IN_Q_OVERFLOW) overflow_ = true;
        if (ev->wd == tmp_wd_ && (ev->mask & IN_MOVED_FROM)) {
          tmp_cookies_.insert(ev->cookie);
        } else if (shard_wds_.count(ev->wd) && (ev->mask & IN_MOVED_TO)) {
          // Only a rename out of tmp/ is a publish; quarantine's put-back rename is not one.
          if (tmp_cookies_.erase(ev->cookie)) {
            ++publishes_[name.substr(0, 32)];
          } else {
            ++other_moves_;
          }
        } else if (ev->wd == dump_wd_ && (ev->mask & IN_CLOSE_WRITE) && name.size() > 4 &&
                   name.compare(name.size() - 4, 4, ".log") == 0) {
          ++compiles_[name.substr(0, 32)];
        }
        p += sizeof(inotify_event) + ev->len;
      }
    }
  }

  const std::map<std::string, std::size_t>& publishes() const { return publishes_; }
  const std::map<std::string, std::size_t>& compiles() const { return compiles_; }
  std::size_t other_moves() const { return other_moves_; }

 private:
  int fd_ = -1, tmp_wd_ = -1, dump_wd_ = -1;
  std::set<int> shard_wds_;
  std::set<std::uint32_t> tmp_cookies_;
  std::map<std::string, std::size_t> publishes_, compiles_;
  std::size_t other_moves_ = 0;
  bool overflow_ = false;
};

struct Figures {
  json phases = json::object();
  std::uint64_t entries_checked = 0;
  std::size_t processes = 0, kills = 0, compiles = 0;
};

std::vector<std::string> key_hexes(const std::vector<kiln::SemanticKey>& keys) {
  std::vector<std::string> out;
  for (const auto& k : keys) out.push_back(kiln::make_build_request(k).cache_key.hex());
  return out;
}

// Waits for every pid; SIGKILLs stragglers after `timeout`. Returns pid -> raw wait status.
std::map<pid_t, int> wait_all(const std::vector<pid_t>& pids, double timeout) {
  std::map<pid_t, int> status;
  const auto start = Clock::now();
  std::set<pid_t> left(pids.begin(), pids.end());
  while (!left.empty()) {
    for (auto it = left.begin(); it != left.end();) {
      int st = 0;
      if (::waitpid(*it, &st, WNOHANG) == *it) {
        status[*it] = st;
        it = left.erase(it);
      } else {
        ++it;
      }
    }
    if (left.empty()) break;
    if (seconds_since(start) > timeout) {
      for (pid_t p : left) {
        std::printf("  worker %d did not stop in %.0f s; killing it\n", p, timeout);
        ::kill(p, SIGKILL);
        int st = 0;
        ::waitpid(p, &st, 0);
        status[p] = -1;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return status;
}

bool exited_cleanly(int st) { return st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0; }

// ---- phase 1: kills ----
// Each worker thread sleeps this long after every build or lookup: 64 threads hammering the store
// back to back on a 2-core machine left a 2-3 s MLA / sparse compile under 2% of a core, so the
// cold keys were not published within the kill window. Paced, they still do ~1 M operations.
constexpr int kPauseUs = 2000;

void phase_kill(const Options& o, const fs::path& base, Figures& fig) {
  std::printf("phase 1: %d workers x %d threads, random SIGKILLs for %.0f s\n", o.processes, o.threads, o.seconds);
  const auto start = Clock::now();
  const fs::path dir = base / "kill", cache = dir / "cache", logs = dir / "logs", dump = dir / "dump";
  fs::create_directories(logs);
  const auto keys = kiln::stress::stress_keys();
  const auto hexes = key_hexes(keys);
  PublishWatch watch(cache, dump, hexes);
  check(watch.ok(), "inotify watches on tmp/, the entry shards and the dump directory");

  const fs::path stop = dir / "stop";
  std::vector<pid_t> pids(o.processes);
  std::vector<int> generation(o.processes, 0);
  const auto start_worker = [&](int i) {
    // Overlapping windows of 8 of the 16 keys: every key is wanted by half the workers at once.
    std::vector<int> set;
    for (int j = 0; j < 8; ++j) set.push_back((i * 5 + j) % static_cast<int>(keys.size()));
    pids[i] = spawn({o.worker, "--cache", cache.string(), "--id", std::to_string(i), "--log",
                     (logs / ("worker-" + std::to_string(i) + ".log")).string(), "--keys", join(set), "--threads",
                     std::to_string(o.threads), "--seconds", "600", "--stop-file", stop.string(), "--dump-dir",
                     dump.string(), "--pause-us", std::to_string(kPauseUs)},
                    logs / ("worker-" + std::to_string(i) + "." + std::to_string(generation[i]++) + ".err"));
  };
  for (int i = 0; i < o.processes; ++i) start_worker(i);

  std::mt19937 rng(12345);
  std::size_t kills = 0, unexpected_exits = 0, spawned = static_cast<std::size_t>(o.processes);
  while (seconds_since(start) < o.seconds) {
    // The first seconds are the compile window (16 cold keys): kill often there, so that lock
    // holders die mid-compile; later kills land mostly in lookups, restarts and disk hits.
    const bool burst = seconds_since(start) < 6;
    std::this_thread::sleep_for(std::chrono::milliseconds(burst ? 50 + rng() % 150 : 100 + rng() % 500));
    watch.drain();
    for (int i = 0; i < o.processes; ++i) {  // a worker that exits by itself has failed
      int st = 0;
      if (::waitpid(pids[i], &st, WNOHANG) == pids[i]) {
        ++unexpected_exits;
        std::printf("  worker %d (pid %d) exited by itself with status %d\n", i, pids[i], st);
        start_worker(i);
        ++spawned;
      }
    }
    const int victim = static_cast<int>(rng() % static_cast<unsigned>(o.processes));
    ::kill(pids[victim], SIGKILL);
    int st = 0;
    ::waitpid(pids[victim], &st, 0);
    ++kills;
    start_worker(victim);
    ++spawned;
  }
  // Kills stop here. On a slow machine a 2-3 s compile whose lock holders kept being killed may not
  // have finished yet: let the survivors publish every key before stopping them (bounded).
  const auto settle = Clock::now();
  while (watch.publishes().size() < hexes.size() && seconds_since(settle) < 120) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    watch.drain();
  }
  touch(stop);
  const auto status = wait_all(pids, 120);
  watch.drain();
  std::size_t clean = 0;
  for (const auto& [pid, st] : status) clean += exited_cleanly(st) ? 1 : 0;
  const double seconds = seconds_since(start);

  const LogSummary s = read_logs(logs);
  std::size_t reported_compiles = 0, builds = 0, lookups = 0, failures = 0;
  for (const auto& [pid, j] : s.last_report) {
    reported_compiles += j.value("compiles", std::size_t{0});
    builds += j.value("builds", std::size_t{0});
    lookups += j.value("lookup_hits", std::size_t{0}) + j.value("lookup_misses", std::size_t{0});
    failures += j.value("failures", std::size_t{0});
  }
  std::size_t publishes = 0, max_publishes = 0, compiles = 0, keys_published = 0;
  for (const auto& hex : hexes) {
    const auto p = watch.publishes().count(hex) ? watch.publishes().at(hex) : 0;
    publishes += p;
    max_publishes = std::max(max_publishes, p);
    keys_published += p > 0 ? 1 : 0;
    compiles += watch.compiles().count(hex) ? watch.compiles().at(hex) : 0;
  }
  std::size_t max_persisted = 0;
  for (const auto& [k, n] : s.persisted_compiles) max_persisted = std::max(max_persisted, n);
  bool hashes_agree = true;
  for (const auto& [k, hs] : s.hashes) hashes_agree = hashes_agree && hs.size() == 1;

  check(unexpected_exits == 0, fmt_count("workers that exited by themselves during the run", unexpected_exits));
  check(clean == status.size(), std::to_string(clean) + "/" + std::to_string(status.size()) +
                                    " final workers exited 0 after the stop file (no wrong cubin, no error)");
  check(failures == 0, fmt_count("failures reported by workers", failures));
  check(s.bad_lines == 0, fmt_count("torn report lines", s.bad_lines));
  check(hashes_agree && s.hashes.size() == keys.size(),
        "every worker saw byte-identical cubins for each of the " + std::to_string(s.hashes.size()) + " keys");
  check(keys_published == keys.size(), std::to_string(keys_published) + "/" + std::to_string(keys.size()) +
                                           " keys published");
  check(max_publishes <= 1, "at most one publish per key (inotify count: " + std::to_string(publishes) +
                                " publishes, max per key " + std::to_string(max_publishes) + ")");
  check(max_persisted <= 1, "at most one reported compile per key while the store was writable (max " +
                                std::to_string(max_persisted) + ")");
  check(compiles >= publishes, "finished compiles (" + std::to_string(compiles) + ", from KILN_DUMP_SOURCE) >= publishes");
  const VerifyResult v = kiln_verify(o, cache);
  check(v.rc == 0 && v.bad == 0 && v.checked == keys.size(),
        "kiln verify: " + std::to_string(v.checked) + " entries checked, " + std::to_string(v.bad) + " bad");
  const auto [locks, stuck] = check_locks(cache);
  check(stuck == 0, std::to_string(locks) + " lock files, " + std::to_string(stuck) + " stuck");
  const std::size_t quarantined = count_files(cache / "quarantine");
  check(quarantined == 0, fmt_count("quarantined files (nothing a kill leaves reads as an entry)", quarantined));
  const std::size_t stale_tmp = count_files(cache / "tmp");

  fig.entries_checked += v.checked;
  fig.processes += spawned;
  fig.kills += kills;
  fig.compiles += compiles;
  fig.phases["kill"] = {{"seconds", seconds},
                        {"workers", o.processes},
                        {"threads_per_worker", o.threads},
                        {"processes_started", spawned},
                        {"processes_reporting", s.last_report.size()},
                        {"kills", kills},
                        {"builds", builds},
                        {"store_lookups", lookups},
                        {"finished_compiles", compiles},
                        {"reported_compiles", reported_compiles},
                        {"publishes", publishes},
                        {"max_publishes_per_key", max_publishes},
                        {"entries_checked", v.checked},
                        {"bad_entries", v.bad},
                        {"lock_files", locks},
                        {"stuck_locks", stuck},
                        {"temp_files_left_by_killed_publishers", stale_tmp}};
  std::printf("  %zu processes started, %zu kills, %zu builds, %zu store lookups, %zu finished compiles "
              "(%zu reported by surviving workers), %zu publishes, %zu temp files left by killed publishers, %.1f s\n",
              spawned, kills, builds, lookups, compiles, reported_compiles, publishes, stale_tmp, seconds);
}

// Polls until every worker's last report holds a hash for each key in `keys`.
bool wait_for_keys(const fs::path& logs, const std::vector<int>& keys, std::size_t workers, double timeout) {
  const auto start = Clock::now();
  while (seconds_since(start) < timeout) {
    const LogSummary s = read_logs(logs);
    std::size_t ready = 0;
    for (const auto& [pid, j] : s.last_report) {
      bool all = true;
      for (int k : keys) all = all && j["hashes"].contains(std::to_string(k));
      ready += all ? 1 : 0;
    }
    if (ready >= workers) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return false;
}

bool entries_exist(const fs::path& cache, const std::vector<std::string>& hexes, const std::vector<int>& keys) {
  for (int k : keys) {
    if (!fs::exists(cache / "entries" / hexes[k].substr(0, 2) / (hexes[k] + ".kiln"))) return false;
  }
  return true;
}

// ---- phase 2: read-only mid-run ----
void phase_read_only(const Options& o, const fs::path& base, Figures& fig) {
  std::printf("phase 2: cache directory made read-only mid-run\n");
  const auto start = Clock::now();
  const fs::path dir = base / "ro", cache = dir / "cache", logs = dir / "logs";
  fs::create_directories(logs);
  fs::create_directories(cache);
  const auto hexes = key_hexes(kiln::stress::stress_keys());
  const std::vector<int> first = {0, 6}, then = {1, 7};
  const int workers = 3;
  std::vector<pid_t> pids;
  for (int i = 0; i < workers; ++i) {
    pids.push_back(spawn({o.worker, "--cache", cache.string(), "--id", std::to_string(i), "--log",
                          (logs / ("worker-" + std::to_string(i) + ".log")).string(), "--keys", join(first),
                          "--then-keys", join(then), "--switch-file", (dir / "switch").string(), "--threads", "2",
                          "--seconds", "300", "--stop-file", (dir / "stop").string()},
                         logs / ("worker-" + std::to_string(i) + ".err")));
  }
  const bool published = [&] {
    const auto t = Clock::now();
    while (seconds_since(t) < 120) {
      if (entries_exist(cache, hexes, first) && wait_for_keys(logs, first, workers, 0.1)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }();
  check(published, "the first keys were published while the directory was writable");

  std::string method;
  bool mounted = false;
  const std::string c = cache.string();
  if (mounts_allowed() && run_shell("mount --bind '" + c + "' '" + c + "' && mount -o remount,bind,ro '" + c + "'") == 0) {
    mounted = true;
    method = "read-only bind mount over the cache directory";
  } else {
    run_shell("umount '" + c + "'");  // the bind may have succeeded without the remount
    fs::rename(cache, dir / "cache.moved");
    touch(cache);
    method = "cache root replaced by a file (mounting not permitted here)";
  }
  std::printf("  method: %s\n", method.c_str());
  const bool write_fails = ::access((cache / "tmp").c_str(), W_OK) != 0 || mounted;
  {
    const fs::path probe = cache / "tmp" / "probe";
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT, 0644);
    check(fd < 0 && write_fails, std::string("a write into the cache now fails: ") + std::strerror(errno));
    if (fd >= 0) ::close(fd);
  }
  touch(dir / "switch");
  const bool served = wait_for_keys(logs, then, workers, 120);
  touch(dir / "stop");
  const auto status = wait_all(pids, 60);
  std::size_t clean = 0;
  for (const auto& [pid, st] : status) clean += exited_cleanly(st) ? 1 : 0;
  check(served, "every worker got the new keys (compiled, served from memory)");
  check(clean == pids.size(), std::to_string(clean) + "/" + std::to_string(pids.size()) + " workers exited 0");

  std::size_t one_warning = 0, other_warnings = 0;
  for (int i = 0; i < workers; ++i) {
    const std::string err = read_text(logs / ("worker-" + std::to_string(i) + ".err"));
    one_warning += count_occurrences(err, kMemoryWarning) == 1 ? 1 : 0;
    other_warnings += count_occurrences(err, "kiln warn") - count_occurrences(err, kMemoryWarning);
    if (count_occurrences(err, kMemoryWarning) != 1) std::printf("  worker %d stderr:\n%s\n", i, err.c_str());
  }
  check(one_warning == static_cast<std::size_t>(workers),
        "each worker said once that it keeps kernels in memory only");
  const LogSummary s = read_logs(logs);
  std::size_t unwritable = 0, lookup_hits = 0;
  for (const auto& [pid, j] : s.last_report) {
    unwritable += j.value("writable", true) ? 0 : 1;
    lookup_hits += j.value("lookup_hits", std::size_t{0});
  }
  check(unwritable == static_cast<std::size_t>(workers), "every worker's store reports itself unwritable");

  if (mounted) {
    run_shell("umount '" + c + "'");
  } else {
    fs::remove(cache);
    fs::rename(dir / "cache.moved", cache);
  }
  const VerifyResult v = kiln_verify(o, cache);
  check(v.rc == 0 && v.bad == 0 && v.checked == first.size(),
        "kiln verify afterwards: " + std::to_string(v.checked) + " entries checked, " + std::to_string(v.bad) + " bad");
  fig.entries_checked += v.checked;
  fig.processes += s.last_report.size();
  std::size_t compiles = 0;
  for (const auto& [pid, j] : s.last_report) compiles += j.value("compiles", std::size_t{0});
  fig.compiles += compiles;
  fig.phases["read_only"] = {{"method", method},
                             {"workers", workers},
                             {"compiles", compiles},
                             {"store_lookup_hits", lookup_hits},
                             {"other_warnings", other_warnings},
                             {"entries_checked", v.checked},
                             {"seconds", seconds_since(start)}};
}

// ---- phase 3: full disk ----
void phase_full_disk(const Options& o, const fs::path& base, Figures& fig) {
  std::printf("phase 3: full disk\n");
  const auto start = Clock::now();
  const fs::path dir = base / "full", cache = dir / "cache", logs = dir / "logs";
  fs::create_directories(logs);
  fs::create_directories(cache);
  const std::string c = cache.string();
  bool mounted = mounts_allowed() && run_shell("mount -t tmpfs -o size=64k tmpfs '" + c + "'") == 0;
  const std::string method = mounted ? "64 KiB tmpfs" : "RLIMIT_FSIZE 16 KiB in each worker (mounting not permitted)";
  std::printf("  method: %s\n", method.c_str());
  const std::vector<int> keys = {2, 3, 4, 8, 9};  // ~20 KiB each: 100 KiB does not fit in 64 KiB
  const int workers = 2;
  std::vector<pid_t> pids;
  for (int i = 0; i < workers; ++i) {
    std::vector<std::string> argv = {o.worker, "--cache", c, "--id", std::to_string(i), "--log",
                                     (logs / ("worker-" + std::to_string(i) + ".log")).string(), "--keys", join(keys),
                                     "--threads", "2", "--seconds", "300", "--stop-file", (dir / "stop").string(),
                                     "--report-ms", "500"};
    if (!mounted) argv.insert(argv.end(), {"--fsize-limit", "16384"});
    pids.push_back(spawn(argv, logs / ("worker-" + std::to_string(i) + ".err")));
  }
  const bool served = wait_for_keys(logs, keys, workers, 150);
  touch(dir / "stop");
  const auto status = wait_all(pids, 60);
  std::size_t clean = 0;
  for (const auto& [pid, st] : status) clean += exited_cleanly(st) ? 1 : 0;
  check(served, "every worker got all five keys");
  check(clean == pids.size(), std::to_string(clean) + "/" + std::to_string(pids.size()) + " workers exited 0");

  const LogSummary s = read_logs(logs);
  std::size_t saw_full = 0, warned_right = 0, compiles = 0;
  for (int i = 0; i < workers; ++i) {
    json last;
    for (const auto& [pid, j] : s.last_report) {
      if (j.value("id", -1) == i) last = j;
    }
    const bool unwritable = last.is_object() && !last.value("writable", true);
    compiles += last.is_object() ? last.value("compiles", std::size_t{0}) : 0;
    saw_full += unwritable ? 1 : 0;
    const std::string err = read_text(logs / ("worker-" + std::to_string(i) + ".err"));
    const std::size_t n = count_occurrences(err, kMemoryWarning);
    warned_right += n == (unwritable ? 1u : 0u) ? 1 : 0;
    if (n != (unwritable ? 1u : 0u)) std::printf("  worker %d stderr:\n%s\n", i, err.c_str());
  }
  check(saw_full >= 1, std::to_string(saw_full) + " workers hit the full disk");
  check(warned_right == static_cast<std::size_t>(workers),
        "each worker that hit it said once that it keeps kernels in memory only (and the others said nothing)");
  const std::size_t tmp_left = count_files(cache / "tmp");
  check(tmp_left == 0, fmt_count("temp files left behind by failed publishes", tmp_left));
  const VerifyResult v = kiln_verify(o, cache);
  // On the tmpfs some entries fit; under RLIMIT_FSIZE (smaller than any entry) none do.
  check(v.rc == 0 && v.bad == 0 && (!mounted || v.checked >= 1) && v.checked < keys.size(),
        "kiln verify: " + std::to_string(v.checked) + " of " + std::to_string(keys.size()) +
            " entries fit and are valid, " + std::to_string(v.bad) + " bad");
  if (mounted) run_shell("umount '" + c + "'");
  fig.entries_checked += v.checked;
  fig.processes += s.last_report.size();
  fig.compiles += compiles;
  fig.phases["full_disk"] = {{"method", method},         {"workers", workers},        {"compiles", compiles},
                             {"workers_hit_full", saw_full}, {"entries_checked", v.checked}, {"seconds", seconds_since(start)}};
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"stress_supervisor: the cache under SIGKILLs, a read-only and a full cache directory"};
  app.add_option("--worker", o.worker, "the stress_warm binary")->required();
  app.add_option("--kiln", o.kiln, "the kiln CLI (kiln verify)")->required();
  app.add_option("--report", o.report, "write the figures here as JSON");
  app.add_option("--seconds", o.seconds, "length of the kill phase")->check(CLI::PositiveNumber);
  app.add_option("--processes", o.processes, "worker processes at once")->check(CLI::PositiveNumber);
  app.add_option("--threads", o.threads, "threads per worker")->check(CLI::PositiveNumber);
  app.add_flag("--keep", o.keep, "keep the work directory");
  CLI11_PARSE(app, argc, argv);
  kiln::register_builtin_families();
  std::string tmpl = (fs::temp_directory_path() / "kiln_stress.XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) {
    std::perror("mkdtemp");
    return 3;
  }
  const fs::path base = tmpl;
  const auto start = Clock::now();
  Figures fig;
  phase_kill(o, base, fig);
  phase_read_only(o, base, fig);
  phase_full_disk(o, base, fig);
  const double seconds = seconds_since(start);
  const json summary = {{"processes", fig.processes}, {"kills", fig.kills},       {"entries_checked", fig.entries_checked},
                        {"compiles", fig.compiles},   {"seconds", seconds},       {"failures", failures()},
                        {"phases", fig.phases}};
  std::printf("stress: %zu processes, %zu kills, %llu entries checked, %zu compiles, %.1f s, %d failed checks\n",
              fig.processes, fig.kills, static_cast<unsigned long long>(fig.entries_checked), fig.compiles, seconds,
              failures());
  std::printf("%s\n", summary.dump().c_str());
  if (!o.report.empty()) std::ofstream(o.report) << summary.dump(2) << "\n";
  if (!o.keep) {
    std::error_code ec;
    fs::remove_all(base, ec);
  } else {
    std::printf("kept %s\n", base.c_str());
  }
  return failures() == 0 ? 0 : 1;
}
