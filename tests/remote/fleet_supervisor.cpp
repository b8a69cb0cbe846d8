// fleet_supervisor: the fleet ctest. It starts its own redis-server (127.0.0.1, a free port) and
// runs fleet_worker processes against it, each a "host" with its own cache directory, warming
// overlapping subsets of 16 writer keys with real NVRTC compiles.
//
//  1. kill: 6 hosts x 3 threads start together while the supervisor SIGKILLs a host every
//     0.1-0.25 s (every other kill aimed at a process holding a remote lock) and restarts it.
//     Counted from outside the workers: finished compiles (the KILN_DUMP_SOURCE log each compile
//     writes, per process incarnation) and uploads (Redis keyspace notifications of successful
//     SETs). Checks: every key uploaded exactly once; compiled exactly once, plus at most one more
//     per SIGKILL of a process that held the key's lock when it died (its compile may have
//     finished before the kill); byte-identical cubins in every report, every host's cache and
//     Redis; every lock carried an expiry and none is left; a new host then gets all 16 keys from
//     Redis with no compile.
//  2. faults: 4 hosts x 2 threads, fresh caches; 150 ms in, Redis is SIGSTOPped (until every host
//     is done, then resumed), killed, restarted empty, or (from the start) limited to a tiny
//     maxmemory with allkeys-lru. Every host serves every key with the same bytes, warns at most
//     once, and its wall time stays within 2 x that of the same start without a remote tier plus
//     3 s (timeouts are 200 ms: a call without a timeout would hang on the stopped server, and a
//     wait for a lock or the 30 s wait bound would show). After the resume, a new host uses Redis
//     again without an error.
// Prints the figures and, with --report FILE, writes them as JSON. Exit 0 when every check passes,
// 77 (ctest: skipped) without redis-server.
//
// Usage: fleet_supervisor --worker PATH [--hosts 6] [--threads 3] [--kills 10] [--report FILE] [--keep]
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "kiln/cache/cubin_store.h"
#include "kiln/cache/remote_store.h"
#include "fleet_keys.h"
#include "kiln/jit/build_request.h"
#include "kiln/runtime/families.h"
#include "tests/support/redis_server.h"
#include "tests/support/supervisor_checks.h"

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;
using kiln::testing::RedisServer;
using namespace kiln::testing::supervisor;

extern char** environ;

namespace {

constexpr const char* kPrefix = "fleet:";
constexpr int kLockTtlMs = 1000;
constexpr int kTimeoutMs = 200;

struct Options {
  std::string worker, report;
  int hosts = 6;
  int threads = 3;
  int kills = 10;
  bool keep = false;
};

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

std::string hash_hex(const std::string& bytes) {
  return fmt::format("{:016x}", XXH3_64bits(bytes.data(), bytes.size()));
}

// Counts successful SETs per key from Redis keyspace notifications (SET NX that finds the key
// present emits nothing), on its own connection, until stop().
class SetCounter {
 public:
  explicit SetCounter(const RedisServer& server) : server_(server) {
    server.command({"CONFIG", "SET", "notify-keyspace-events", "E$"});
    c_ = redisConnect("127.0.0.1", server.port());
    if (c_ == nullptr || c_->err) throw std::runtime_error("SetCounter: cannot connect");
    void* r = redisCommand(c_, "SUBSCRIBE __keyevent@0__:set fleet-test-stop");
    if (r == nullptr) throw std::runtime_error("SetCounter: SUBSCRIBE failed");
    freeReplyObject(r);
    thread_ = std::thread([this] { run(); });
  }
  ~SetCounter() { stop(); }
  void stop() {
    if (!thread_.joinable()) return;
    server_.command({"PUBLISH", "fleet-test-stop", "x"});
    thread_.join();
    redisFree(c_);
  }
  std::map<std::string, int> counts() {
    std::lock_guard<std::mutex> lock(mutex_);
    return counts_;
  }

 private:
  void run() {
    for (;;) {
      void* raw = nullptr;
      if (redisGetReply(c_, &raw) != REDIS_OK || raw == nullptr) return;
      auto* r = static_cast<redisReply*>(raw);
      bool stop = false;
      if (r->type == REDIS_REPLY_ARRAY && r->elements == 3 && std::string(r->element[0]->str) == "message") {
        const std::string channel(r->element[1]->str, r->element[1]->len);
        if (channel == "fleet-test-stop") {
          stop = true;
        } else {
          std::lock_guard<std::mutex> lock(mutex_);
          ++counts_[std::string(r->element[2]->str, r->element[2]->len)];
        }
      }
      freeReplyObject(r);
      if (stop) return;
    }
  }
  const RedisServer& server_;
  redisContext* c_ = nullptr;
  std::thread thread_;
  std::mutex mutex_;
  std::map<std::string, int> counts_;
};

struct LockView {
  std::string key;  // the Redis key
  long pid = 0;     // from the owner token host/pid/nonce/n
  long long pttl = 0;
};

std::vector<LockView> scan_locks(const RedisServer& server) {
  std::vector<LockView> out;
  for (const auto& k : server.command({"KEYS", std::string(kPrefix) + "lock:*"}).elements) {
    LockView v;
    v.key = k.str;
    const std::string token = server.command({"GET", k.str}).str;
    const std::size_t a = token.find('/');
    if (a != std::string::npos) v.pid = std::atol(token.c_str() + a + 1);
    v.pttl = server.command({"PTTL", k.str}).integer;
    if (v.pttl != -2) out.push_back(v);  // -2: expired or released between KEYS and PTTL
  }
  return out;
}

struct Host {
  int id = 0;
  fs::path cache;
  std::vector<int> keys;
  pid_t pid = -1;
  int incarnation = 0;
  bool done = false;
  int exit_code = -1;
  json report;
};

class Fleet {
 public:
  Fleet(const Options& o, const fs::path& work, std::string phase, bool remote, const RedisServer& server)
      : o_(o), dir_(work / phase), remote_(remote), server_(server) {
    fs::create_directories(dir_ / "out");
    fs::create_directories(dir_ / "log");
    fs::create_directories(dir_ / "dump");
  }

  void add_host(std::vector<int> keys) {
    Host h;
    h.id = static_cast<int>(hosts_.size());
    h.cache = dir_ / fmt::format("cache{}", h.id);
    h.keys = std::move(keys);
    hosts_.push_back(std::move(h));
  }

  void start_all() {
    started_ = Clock::now();
    for (Host& h : hosts_) spawn(h);
  }

  void spawn(Host& h) {
    const std::string out = (dir_ / "out" / fmt::format("h{}.json", h.id)).string();
    const std::string log = (dir_ / "log" / fmt::format("h{}.log", h.id)).string();
    const std::string dump = (dir_ / "dump" / fmt::format("h{}.{}", h.id, h.incarnation)).string();
    std::vector<std::string> args = {o_.worker, "--cache",   h.cache.string(), "--out",     out,  "--keys",
                                     join(h.keys), "--threads", std::to_string(threads_), "--dump-dir", dump};
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::strncmp(*e, "KILN_", 5) != 0) env.emplace_back(*e);
    }
    env.emplace_back("KILN_LOG_LEVEL=warn");
    if (remote_) {
      env.push_back(fmt::format("KILN_REMOTE_CACHE={}", server_.url()));
      env.push_back(fmt::format("KILN_REMOTE_CACHE_PREFIX={}", kPrefix));
      env.push_back(fmt::format("KILN_REMOTE_CACHE_CONNECT_TIMEOUT_MS={}", kTimeoutMs));
      env.push_back(fmt::format("KILN_REMOTE_CACHE_TIMEOUT_MS={}", kTimeoutMs));
      env.push_back(fmt::format("KILN_REMOTE_CACHE_LOCK_TTL_MS={}", kLockTtlMs));
      env.emplace_back("KILN_REMOTE_CACHE_WAIT_MS=30000");
      env.emplace_back("KILN_REMOTE_CACHE_RETRY_MS=1000");
    }
    std::vector<char*> argv, envp;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
        ::close(fd);
      }
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
    h.pid = pid;
    ++processes_;
  }

  // Reaps hosts that exited on their own.
  void reap() {
    for (Host& h : hosts_) {
      if (h.done || h.pid <= 0) continue;
      int status = 0;
      if (::waitpid(h.pid, &status, WNOHANG) != h.pid) continue;
      h.pid = -1;
      h.done = true;
      h.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      const std::string text = read_text(dir_ / "out" / fmt::format("h{}.json", h.id));
      h.report = json::parse(text, nullptr, false);
    }
  }

  bool all_done() const {
    return std::all_of(hosts_.begin(), hosts_.end(), [](const Host& h) { return h.done; });
  }

  std::vector<Host*> running() {
    std::vector<Host*> out;
    for (Host& h : hosts_) {
      if (!h.done && h.pid > 0) out.push_back(&h);
    }
    return out;
  }

  void kill_and_restart(Host& h) {
    ::kill(h.pid, SIGKILL);
    int status = 0;
    ::waitpid(h.pid, &status, 0);
    ++h.incarnation;
    spawn(h);
  }

  void kill_all() {
    for (Host& h : hosts_) {
      if (h.pid > 0) {
        ::kill(h.pid, SIGKILL);
        ::waitpid(h.pid, nullptr, 0);
        h.pid = -1;
      }
    }
  }

  // Waits for every host, calling tick(elapsed ms) meanwhile; false after `limit_s`.
  bool wait_all(double limit_s, const std::function<void(double)>& tick = nullptr) {
    while (!all_done()) {
      reap();
      if (tick) tick(ms_since(started_));
      if (ms_since(started_) > limit_s * 1000) {
        kill_all();
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
  }

  // Finished compiles per cache key (hex), from every incarnation's dump directory.
  std::map<std::string, int> compiles() const {
    std::map<std::string, int> out;
    std::error_code ec;
    for (fs::recursive_directory_iterator it(dir_ / "dump", ec), end; !ec && it != end; it.increment(ec)) {
      if (it->path().extension() == ".log") ++out[it->path().stem().string()];
    }
    return out;
  }

  std::string log_of(const Host& h) const { return read_text(dir_ / "log" / fmt::format("h{}.log", h.id)); }

  std::vector<Host>& hosts() { return hosts_; }
  int processes() const { return processes_; }
  double elapsed_ms() const { return ms_since(started_); }
  void set_threads(int t) { threads_ = t; }

 private:
  const Options& o_;
  fs::path dir_;
  bool remote_;
  const RedisServer& server_;
  std::vector<Host> hosts_;
  int threads_ = 2;
  int processes_ = 0;
  Clock::time_point started_;
};

kiln::RemoteOptions remote_options(const RedisServer& server) {
  kiln::RemoteOptions o;
  o.endpoint = server.endpoint();
  o.key_prefix = kPrefix;
  return o;
}

// Every host exited 0 and reported every one of its keys with the reference bytes.
void check_served(Fleet& fleet, const std::map<int, std::string>& reference, const std::string& phase) {
  std::size_t failed = 0, missing = 0, differing = 0;
  for (Host& h : fleet.hosts()) {
    if (h.exit_code != 0 || !h.report.is_object()) {
      ++failed;
      std::printf("  host %d exited %d; log:\n%s\n", h.id, h.exit_code, fleet.log_of(h).c_str());
      continue;
    }
    for (int k : h.keys) {
      const json& item = h.report["keys"][std::to_string(k)];
      if (!item.is_object()) {
        ++missing;
        continue;
      }
      auto it = reference.find(k);
      if (it != reference.end() && item["hash"] != it->second) ++differing;
    }
  }
  check(failed == 0, fmt::format("{}: every host exited 0 with a report ({} failed)", phase, failed));
  check(missing == 0, fmt::format("{}: every host served every one of its keys ({} missing)", phase, missing));
  check(differing == 0, fmt::format("{}: every served cubin is byte-identical to the reference ({} differ)", phase, differing));
}

std::vector<int> pick_keys(std::mt19937& rng, std::size_t n, std::size_t total) {
  std::vector<int> all(total);
  for (std::size_t i = 0; i < total; ++i) all[i] = static_cast<int>(i);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(n);
  std::sort(all.begin(), all.end());
  return all;
}

json kill_phase(const Options& o, const fs::path& work, RedisServer& server, std::map<int, std::string>& reference) {
  std::printf("phase 1: %d hosts x %d threads, SIGKILLs\n", o.hosts, o.threads);
  const std::vector<kiln::SemanticKey> keys = kiln::fleet::fleet_keys();
  std::vector<std::string> hex;  // cache key per index
  for (const auto& k : keys) hex.push_back(kiln::make_build_request(k).cache_key.hex());
  server.command({"FLUSHALL"});
  SetCounter sets(server);

  std::mt19937 rng(12345);
  Fleet fleet(o, work, "kill", true, server);
  fleet.set_threads(o.threads);
  std::set<int> covered;
  for (int h = 0; h < o.hosts; ++h) {
    std::vector<int> mine = pick_keys(rng, 10, keys.size());
    covered.insert(mine.begin(), mine.end());
    fleet.add_host(mine);
  }
  for (std::size_t k = 0; k < keys.size(); ++k) {  // every key is someone's
    if (!covered.count(static_cast<int>(k))) fleet.hosts()[k % fleet.hosts().size()].keys.push_back(static_cast<int>(k));
  }

  std::map<std::string, int> holder_kills;  // lock key -> SIGKILLs of its holder
  std::size_t lock_views = 0, bad_ttls = 0;
  int kills = 0;
  fleet.start_all();
  auto next_kill = Clock::now() + std::chrono::milliseconds(100 + rng() % 150);
  bool timed_out = false;
  while (!fleet.all_done()) {
    fleet.reap();
    const auto running = fleet.running();
    if (kills < o.kills && Clock::now() >= next_kill && !running.empty()) {
      const std::vector<LockView> locks = scan_locks(server);
      lock_views += locks.size();
      for (const LockView& l : locks) {
        // -1: no expiry. 0 is a lock in its last millisecond.
        if (l.pttl < 0 || l.pttl > kLockTtlMs) {
          ++bad_ttls;
          std::printf("  lock %s has PTTL %lld\n", l.key.c_str(), l.pttl);
        }
      }
      Host* victim = running[rng() % running.size()];
      if (kills % 2 == 0) {
        for (const LockView& l : locks) {
          for (Host* h : running) {
            if (h->pid == l.pid) victim = h;
          }
        }
      }
      for (const LockView& l : locks) {
        if (l.pid == victim->pid) ++holder_kills[l.key];
      }
      fleet.kill_and_restart(*victim);
      ++kills;
      next_kill = Clock::now() + std::chrono::milliseconds(100 + rng() % 150);
    }
    if (fleet.elapsed_ms() > 120000) {
      fleet.kill_all();
      timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const double wall_ms = fleet.elapsed_ms();
  check(!timed_out, "kill: the fleet finished within 120 s");
  // A killed holder's lock lives until its expiry; after that nothing may be left.
  const auto t0 = Clock::now();
  while (!scan_locks(server).empty() && ms_since(t0) < kLockTtlMs + 1000) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const std::size_t stuck = scan_locks(server).size();
  sets.stop();

  // Reference bytes: what the first host that reported each key got.
  for (Host& h : fleet.hosts()) {
    if (!h.report.is_object()) continue;
    for (auto& [k, item] : h.report["keys"].items()) reference.emplace(std::stoi(k), item["hash"].get<std::string>());
  }
  check_served(fleet, reference, "kill");
  check(reference.size() == keys.size(), fmt::format("kill: all {} keys were served ({})", keys.size(), reference.size()));

  const std::map<std::string, int> compiles = fleet.compiles();
  const std::map<std::string, int> uploads = sets.counts();
  std::size_t total_compiles = 0, total_uploads = 0, over = 0, never = 0, upload_wrong = 0, extra_allowed = 0;
  for (std::size_t k = 0; k < keys.size(); ++k) {
    const auto c = compiles.find(hex[k]);
    const int n = c == compiles.end() ? 0 : c->second;
    const auto hk = holder_kills.find(std::string(kPrefix) + "lock:" + hex[k]);
    const int allowed = 1 + (hk == holder_kills.end() ? 0 : hk->second);
    extra_allowed += static_cast<std::size_t>(allowed - 1);
    total_compiles += static_cast<std::size_t>(n);
    never += n == 0;
    over += n > allowed;
    if (n > allowed) std::printf("  key %zu compiled %d times, allowed %d\n", k, n, allowed);
    const auto u = uploads.find(std::string(kPrefix) + hex[k]);
    const int nu = u == uploads.end() ? 0 : u->second;
    total_uploads += static_cast<std::size_t>(nu);
    upload_wrong += nu != 1;
  }
  check(never == 0, fmt::format("kill: every key was compiled somewhere ({} never)", never));
  check(over == 0, fmt::format("kill: each key compiled once fleet-wide, plus at most one per SIGKILLed lock holder: "
                               "{} compiles of {} keys, {} holder kills, {} over",
                               total_compiles, keys.size(), extra_allowed, over));
  check(upload_wrong == 0, fmt::format("kill: each key uploaded exactly once ({} uploads, {} keys off)", total_uploads, upload_wrong));
  check(bad_ttls == 0, fmt::format("kill: every lock seen carried an expiry <= {} ms ({} lock views, {} without)", kLockTtlMs,
                                   lock_views, bad_ttls));
  check(stuck == 0, fmt::format("kill: no lock left {} ms after the last host ({} left)", kLockTtlMs, stuck));

  // Every host's own cache and Redis hold exactly the reported bytes.
  kiln::RemoteStore remote(remote_options(server));
  std::size_t local_checked = 0, local_bad = 0, remote_bad = 0;
  for (Host& h : fleet.hosts()) {
    kiln::CubinStore store(kiln::CubinStore::Options{.root = h.cache});
    for (int k : h.keys) {
      const auto hit = store.lookup(*kiln::CacheKey::parse_hex(hex[static_cast<std::size_t>(k)]));
      ++local_checked;
      local_bad += !hit || hash_hex(hit->entry.cubin) != reference[k];
    }
  }
  for (std::size_t k = 0; k < keys.size(); ++k) {
    const auto e = remote.fetch(*kiln::CacheKey::parse_hex(hex[k]));
    remote_bad += !e || hash_hex(e->cubin) != reference[static_cast<int>(k)];
  }
  check(local_bad == 0, fmt::format("kill: {} local entries byte-identical to the reports ({} differ or missing)", local_checked, local_bad));
  check(remote_bad == 0, fmt::format("kill: the {} Redis entries byte-identical to the reports ({} differ or missing)", keys.size(), remote_bad));

  // A host joining later takes everything from Redis.
  Fleet late(o, work, "kill-late", true, server);
  std::vector<int> all;
  for (std::size_t k = 0; k < keys.size(); ++k) all.push_back(static_cast<int>(k));
  late.add_host(all);
  late.start_all();
  late.wait_all(60);
  check_served(late, reference, "kill, late host");
  const json& lr = late.hosts()[0].report;
  const std::uint64_t late_remote = lr.is_object() ? lr["service"].value("remote_hits", 0ull) : 0;
  const std::uint64_t late_compiles = lr.is_object() ? lr["service"].value("compiles", 99ull) : 99;
  check(late_remote == keys.size() && late_compiles == 0,
        fmt::format("kill: a late host got {} of {} keys from Redis with {} compiles", late_remote, keys.size(), late_compiles));

  std::printf("  %d processes started, %d SIGKILLs (holding %zu locks), %zu compiles, %zu uploads, %.1f s\n",
              fleet.processes(), kills, extra_allowed, total_compiles, total_uploads, wall_ms / 1000);
  return {{"hosts", o.hosts},          {"threads", o.threads},      {"keys", keys.size()},
          {"processes", fleet.processes()}, {"kills", kills},       {"holder_kills", extra_allowed},
          {"compiles", total_compiles}, {"uploads", total_uploads}, {"lock_views", lock_views},
          {"locks_left", stuck},        {"wall_ms", wall_ms}};
}

// One start of fresh hosts; the fault is injected 150 ms in, from this thread (the server's
// parent thread must outlive it: see RedisServer), and lasts until every host is done.
json fault_phase(const Options& o, const fs::path& work, RedisServer& server, const std::string& name, bool remote,
                 const std::vector<std::vector<int>>& subsets, const std::map<int, std::string>& reference,
                 double reference_wall_ms) {
  std::printf("phase 2: %s\n", name.c_str());
  Fleet fleet(o, work, name, remote, server);
  fleet.set_threads(2);
  for (const auto& s : subsets) fleet.add_host(s);
  fleet.start_all();
  bool injected = false;
  const bool finished = fleet.wait_all(120, [&](double elapsed_ms) {
    if (injected || elapsed_ms < 150) return;
    injected = true;
    if (name == "redis-stopped") server.stop();
    if (name == "redis-killed") server.kill();
    if (name == "redis-restarted-empty") server.start();  // kills it, then starts an empty one
  });
  if (name == "redis-stopped") server.resume();
  if (name == "redis-killed") server.start();
  check(finished, name + ": every host finished within 120 s");
  check_served(fleet, reference, name);
  double max_wall = 0;
  std::size_t over_warned = 0;
  std::uint64_t remote_hits = 0;
  for (Host& h : fleet.hosts()) {
    if (h.report.is_object()) {
      max_wall = std::max(max_wall, h.report.value("wall_ms", 0.0));
      remote_hits += h.report["service"].value("remote_hits", 0ull);
    }
    over_warned += count_occurrences(fleet.log_of(h), "is unavailable") > 1;
  }
  std::size_t compiles = 0;
  for (const auto& [k, n] : fleet.compiles()) compiles += static_cast<std::size_t>(n);
  if (reference_wall_ms > 0) {
    const double bound = 2 * reference_wall_ms + 3000;
    check(max_wall <= bound, fmt::format("{}: slowest host {:.0f} ms <= {:.0f} ms (2 x {:.0f} ms without a remote tier + 3 s)",
                                         name, max_wall, bound, reference_wall_ms));
    check(over_warned == 0, fmt::format("{}: each host warned at most once about the remote cache", name));
  }
  if (name == "redis-stopped") {
    Fleet after(o, work, name + "-resumed", true, server);
    after.add_host(subsets[0]);
    after.start_all();
    after.wait_all(60);
    check_served(after, reference, name + ", resumed");
    const json& r = after.hosts()[0].report;
    check(r.is_object() && r["remote"].value("errors", 1ull) == 0,
          name + ": after the resume a new host uses Redis without an error");
  }
  std::printf("  %zu hosts, %zu compiles, %llu remote hits, slowest host %.0f ms\n", subsets.size(), compiles,
              static_cast<unsigned long long>(remote_hits), max_wall);
  return {{"hosts", subsets.size()}, {"compiles", compiles}, {"remote_hits", remote_hits}, {"max_wall_ms", max_wall}};
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"fleet_supervisor: the remote tier under SIGKILLs and Redis faults"};
  app.add_option("--worker", o.worker, "the fleet_worker binary")->required();
  app.add_option("--report", o.report, "write the figures here as JSON");
  app.add_option("--hosts", o.hosts, "hosts in the kill phase")->check(CLI::PositiveNumber);
  app.add_option("--threads", o.threads, "threads per host")->check(CLI::PositiveNumber);
  app.add_option("--kills", o.kills, "SIGKILLs in the kill phase")->check(CLI::NonNegativeNumber);
  app.add_flag("--keep", o.keep, "keep the work directory");
  CLI11_PARSE(app, argc, argv);
  if (RedisServer::binary().empty()) {
    std::printf("SKIPPED: fleet test not run: redis-server is not on PATH and KILN_REDIS_SERVER is not set "
                "(Debian: apt-get install redis-server)\n");
    return 77;
  }
  kiln::register_builtin_families();
  std::string tmpl = (fs::temp_directory_path() / "kiln_fleet.XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) return 3;
  const fs::path work = tmpl;
  const auto start = Clock::now();
  json report;
  try {
    RedisServer server;
    std::printf("redis-server on port %d, work dir %s\n", server.port(), work.c_str());
    std::map<int, std::string> reference;
    report["kill"] = kill_phase(o, work, server, reference);

    std::mt19937 rng(777);
    std::vector<std::vector<int>> subsets;
    for (int h = 0; h < 4; ++h) subsets.push_back(pick_keys(rng, 6, kiln::fleet::fleet_keys().size()));
    json faults;
    faults["no-remote"] = fault_phase(o, work, server, "no-remote", false, subsets, reference, 0);
    const double reference_wall = faults["no-remote"]["max_wall_ms"].get<double>();
    for (const char* fault : {"redis-stopped", "redis-killed", "redis-restarted-empty"}) {
      server.command({"FLUSHALL"});
      faults[fault] = fault_phase(o, work, server, fault, true, subsets, reference, reference_wall);
    }
    server.command({"FLUSHALL"});
    const std::string info = server.command({"INFO", "memory"}).str;
    const long long used = std::stoll(info.substr(info.find("used_memory:") + 12));
    server.command({"CONFIG", "SET", "maxmemory-policy", "allkeys-lru"});
    // Room for a few entries beside the clients' buffers: uploads evict each other.
    server.command({"CONFIG", "SET", "maxmemory", std::to_string(used + 384 * 1024)});
    faults["redis-tiny-maxmemory"] =
        fault_phase(o, work, server, "redis-tiny-maxmemory", true, subsets, reference, reference_wall);
    const std::string stats = server.command({"INFO", "stats"}).str;
    const long long evicted = std::stoll(stats.substr(stats.find("evicted_keys:") + 13));
    faults["redis-tiny-maxmemory"]["evicted_keys"] = evicted;
    std::printf("  %lld keys evicted\n", evicted);
    report["faults"] = faults;
  } catch (const std::exception& e) {
    check(false, std::string("unexpected error: ") + e.what());
  }
  report["wall_s"] = ms_since(start) / 1000;
  report["failures"] = failures();
  std::printf("fleet test: %.1f s, %d failed checks\n", ms_since(start) / 1000, failures());
  if (!o.report.empty()) std::ofstream(o.report) << report.dump(2) << "\n";
  if (!o.keep) {
    std::error_code ec;
    fs::remove_all(work, ec);
  }
  return failures() == 0 ? 0 : 1;
}
