// CubinStore on a real file system, with real processes for the cross-process guarantees.
//
// The multi-process tests exec tests/tools/store_worker. Its path comes from the environment
// variable KILN_STORE_WORKER, else from the compile definition KILN_STORE_WORKER_PATH; without
// either those tests fail with a message saying so.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "kiln/cache/cubin_store.h"
#include "kiln/cache/file_lock.h"
#include "kiln/jit/error.h"
#include "tests/support/files.h"
#include "tests/support/stderr_capture.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;
using kiln::CacheEntry;
using kiln::CacheKey;
using kiln::CubinStore;
using kiln::Tier;
using kiln::testing::read_text;
using kiln::testing::write_text;

namespace {

struct TempDir : kiln::testing::TempDir {
  TempDir() : kiln::testing::TempDir("kiln_store_test") {}
};

using kiln::testing::StderrCapture;

std::size_t count_of(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1)) ++n;
  return n;
}

CacheKey key_n(std::uint64_t n) { return CacheKey{0xa1b2c3d4e5f60718ULL ^ (n * 0x9e3779b97f4a7c15ULL), n + 1}; }

CacheEntry make_entry(const CacheKey& key, char fill = 'c', std::size_t cubin_bytes = 1000) {
  CacheEntry e;
  e.key = key;
  e.semantic_key = "test/sm_90a/" + key.hex().substr(0, 8);
  e.metadata = {{"arch", "sm_90a"}, {"compile_ms", 1}};
  e.cubin.assign(cubin_bytes, fill);
  e.cubin[0] = '\x7f';
  return e;
}

std::vector<fs::path> files_in(const fs::path& dir, const std::string& ext = "") {
  std::vector<fs::path> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (ext.empty() || it->path().extension() == ext) out.push_back(it->path());
  }
  return out;
}

void set_mtime(const fs::path& p, std::chrono::seconds ago) {
  const auto when = std::chrono::system_clock::now() - ago;
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(when.time_since_epoch()).count();
  struct timespec times[2];
  times[0].tv_sec = times[1].tv_sec = static_cast<time_t>(ns / 1000000000);
  times[0].tv_nsec = times[1].tv_nsec = static_cast<long>(ns % 1000000000);
  REQUIRE(::utimensat(AT_FDCWD, p.c_str(), times, 0) == 0);
}

std::chrono::system_clock::time_point mtime_of(const fs::path& p) {
  struct stat st {};
  REQUIRE(::stat(p.c_str(), &st) == 0);
  return std::chrono::system_clock::time_point(std::chrono::duration_cast<std::chrono::system_clock::duration>(
      std::chrono::seconds(st.st_mtim.tv_sec) + std::chrono::nanoseconds(st.st_mtim.tv_nsec)));
}

std::string worker_path() {
  if (const char* env = std::getenv("KILN_STORE_WORKER")) return env;
#ifdef KILN_STORE_WORKER_PATH
  return KILN_STORE_WORKER_PATH;
#else
  FAIL("set KILN_STORE_WORKER to the store_worker binary (tests/tools/store_worker.cpp)");
  return {};
#endif
}

using WorkerResult = kiln::testing::ProcessResult;

// Starts store_worker with `args`; stdout/stderr go to files under `dir`. `crash_point` sets
// KILN_TEST_CRASH_POINT; `inherit_fd` stays open across exec (the start barrier).
std::unique_ptr<kiln::testing::Subprocess> spawn_worker(const std::vector<std::string>& args, const fs::path& dir, int index,
                                                        const std::string& crash_point = "", int inherit_fd = -1) {
  std::vector<std::string> argv{worker_path()};
  argv.insert(argv.end(), args.begin(), args.end());
  if (inherit_fd >= 0) {
    argv.push_back("--wait-fd");
    argv.push_back(std::to_string(inherit_fd));
  }
  kiln::testing::Environment env = kiln::testing::current_environment();
  if (crash_point.empty()) env.erase("KILN_TEST_CRASH_POINT");
  else env["KILN_TEST_CRASH_POINT"] = crash_point;
  return std::make_unique<kiln::testing::Subprocess>(
      kiln::testing::SpawnOptions{.argv = argv,
                                  .env = env,
                                  .stdout_file = dir / ("worker" + std::to_string(index) + ".out"),
                                  .stderr_file = dir / ("worker" + std::to_string(index) + ".err")});
}

WorkerResult run_worker(const std::vector<std::string>& args, const fs::path& dir, int index,
                        const std::string& crash_point = "") {
  return spawn_worker(args, dir, index, crash_point)->wait();
}

std::size_t line_count(const fs::path& p) {
  const std::string text = read_text(p);
  return static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n'));
}

CubinStore::Options root_options(const fs::path& root) {
  CubinStore::Options o;
  o.root = root;
  return o;
}

// The layout entries/<2 hex>/<32 hex>.kiln, used by the corruption tests to damage files directly.
fs::path entry_file(const fs::path& root, const CacheKey& key) {
  const std::string hex = key.hex();
  return root / "entries" / hex.substr(0, 2) / (hex + ".kiln");
}

}  // namespace

TEST_CASE("cubin store: publish then lookup returns the entry from the writable layer", "[unit][cache]") {
  TempDir dir;
  CubinStore store(root_options(dir.path()));
  REQUIRE(store.writable());
  const CacheKey key = key_n(1);
  CHECK_FALSE(store.lookup(key).has_value());
  REQUIRE(store.publish(make_entry(key)));
  CHECK(fs::is_regular_file(entry_file(dir.path(), key)));
  CHECK(CubinStore::entry_path(dir.path(), key) == entry_file(dir.path(), key));
  for (const char* sub : {"locks", "quarantine", "tmp"}) CHECK(fs::is_directory(dir.path() / sub));
  CHECK(files_in(dir.path() / "tmp").empty());

  auto hit = store.lookup(key);
  REQUIRE(hit.has_value());
  CHECK(hit->tier == Tier::kWritable);
  CHECK(hit->file == entry_file(dir.path(), key));
  CHECK(hit->entry.cubin == make_entry(key).cubin);
  CHECK(hit->entry.semantic_key == make_entry(key).semantic_key);
  CHECK(hit->entry.metadata == make_entry(key).metadata);
}

TEST_CASE("cubin store: get_or_build builds once, then hits", "[unit][cache]") {
  TempDir dir;
  CubinStore store(root_options(dir.path()));
  const CacheKey key = key_n(2);
  int builds = 0;
  bool built = false;
  auto first = store.get_or_build(key, [&] { ++builds; return make_entry(key); }, &built);
  CHECK(built);
  CHECK(first.tier == Tier::kWritable);
  auto second = store.get_or_build(key, [&] { ++builds; return make_entry(key); }, &built);
  CHECK_FALSE(built);
  CHECK(builds == 1);
  CHECK(second.entry.cubin == first.entry.cubin);
  CHECK(fs::exists(store.lock_path(key)));
}

TEST_CASE("cubin store: a throwing build releases the lock and publishes nothing", "[unit][cache]") {
  TempDir dir;
  CubinStore store(root_options(dir.path()));
  const CacheKey key = key_n(3);
  CHECK_THROWS_WITH(store.get_or_build(key, []() -> CacheEntry { throw std::runtime_error("nvrtc said no"); }),
                    "nvrtc said no");
  CHECK_FALSE(fs::exists(entry_file(dir.path(), key)));
  CHECK(kiln::FileLock::try_lock(store.lock_path(key)).has_value());
  bool built = false;
  store.get_or_build(key, [&] { return make_entry(key); }, &built);
  CHECK(built);
}

TEST_CASE("cubin store: a build that returns another key's entry is an internal error", "[unit][cache]") {
  TempDir dir;
  CubinStore store(root_options(dir.path()));
  try {
    store.get_or_build(key_n(4), [&] { return make_entry(key_n(5)); });
    FAIL("no throw");
  } catch (const kiln::Error& e) {
    CHECK(e.code() == kiln::ErrorCode::kInternal);
  }
  CHECK_FALSE(fs::exists(entry_file(dir.path(), key_n(4))));
  CHECK_FALSE(fs::exists(entry_file(dir.path(), key_n(5))));
}

TEST_CASE("cubin store: each kind of bad entry is a miss, is quarantined and is rebuilt", "[unit][cache]") {
  struct Damage {
    const char* name;
    std::function<void(const fs::path& root, const fs::path& file, const std::string& good)> apply;
    const char* reason;  // expected in the quarantine sidecar
  };
  auto truncate_to = [](std::size_t n) {
    return [n](const fs::path&, const fs::path& f, const std::string& good) { write_text(f, good.substr(0, n)); };
  };
  auto flip = [](std::function<std::size_t(std::size_t)> where) {
    return [where](const fs::path&, const fs::path& f, const std::string& good) {
      std::string bad = good;
      bad[where(bad.size())] ^= 0x20;
      write_text(f, bad);
    };
  };
  const std::vector<Damage> damages = {
      {"empty file", truncate_to(0), "empty file"},
      {"truncated in the magic", truncate_to(5), "truncated"},
      {"truncated in the header", truncate_to(30), "truncated"},
      {"truncated in the metadata", truncate_to(80), "truncated"},
      {"truncated in the cubin", [](auto&, auto& f, auto& g) { write_text(f, g.substr(0, g.size() / 2)); }, "truncated"},
      {"truncated by one byte", [](auto&, auto& f, auto& g) { write_text(f, g.substr(0, g.size() - 1)); }, "truncated"},
      {"flipped byte in the cubin", flip([](std::size_t n) { return n - 100; }), "checksum mismatch"},
      {"flipped byte in the header (key echo)", flip([](std::size_t) { return 14; }), "checksum mismatch"},
      {"flipped byte in the header (magic)", flip([](std::size_t) { return 2; }), "bad magic"},
      {"flipped byte in the header (a length)", flip([](std::size_t) { return 33; }), ""},
      {"wrong key echo",
       [](const fs::path& root, const fs::path& f, const std::string&) {
         CubinStore other(root_options(root / "other"));
         REQUIRE(other.publish(make_entry(key_n(99), 'z')));
         fs::copy_file(entry_file(root / "other", key_n(99)), f, fs::copy_options::overwrite_existing);
       },
       "key echo mismatch"},
      {"garbage bytes",
       [](auto&, auto& f, auto&) {
         std::mt19937 rng(42);
         std::string garbage(5000, '\0');
         for (char& c : garbage) c = static_cast<char>(rng());
         write_text(f, garbage);
       },
       "bad magic"},
      {"a directory in place of the file",
       [](auto&, auto& f, auto&) {
         fs::remove(f);
         fs::create_directory(f);
       },
       "not a regular file"},
  };
  for (const Damage& d : damages) {
    DYNAMIC_SECTION(d.name) {
      TempDir dir;
      const CacheKey key = key_n(10);
      const fs::path file = entry_file(dir.path(), key);
      {
        CubinStore writer(root_options(dir.path()));
        REQUIRE(writer.publish(make_entry(key)));
      }
      d.apply(dir.path(), file, read_text(file));

      CubinStore store(root_options(dir.path()));
      StderrCapture capture;
      CHECK_FALSE(store.lookup(key).has_value());
      const std::string warnings = capture.text();
      CHECK_THAT(warnings, Catch::Contains("is bad") && Catch::Contains("quarantine"));
      CHECK_FALSE(fs::exists(file));
      const auto quarantined = files_in(dir.path() / "quarantine", ".bad");
      REQUIRE(quarantined.size() == 1);
      const auto sidecars = files_in(dir.path() / "quarantine", ".reason");
      REQUIRE(sidecars.size() == 1);
      CHECK_THAT(read_text(sidecars[0]), Catch::Contains(d.reason));
      CHECK(store.stats().quarantined == 1);

      bool built = false;
      auto hit = store.get_or_build(key, [&] { return make_entry(key); }, &built);
      CHECK(built);
      CHECK(hit.entry.cubin == make_entry(key).cubin);
      auto again = store.lookup(key);
      REQUIRE(again.has_value());
      CHECK(again->entry.cubin == make_entry(key).cubin);
    }
  }
}

TEST_CASE("cubin store: 8 processes warming one key build it exactly once and get identical bytes",
          "[unit][cache][multiprocess][concurrency]") {
  TempDir dir;
  const CacheKey key = key_n(20);
  const fs::path builds = dir.path() / "builds";
  int barrier[2];
  REQUIRE(::pipe(barrier) == 0);
  // Only the read end may cross exec, or the workers would hold the write end open themselves.
  REQUIRE(::fcntl(barrier[1], F_SETFD, FD_CLOEXEC) == 0);
  constexpr int kWorkers = 8;
  std::vector<std::unique_ptr<kiln::testing::Subprocess>> workers;
  for (int i = 0; i < kWorkers; ++i) {
    workers.push_back(spawn_worker({"--root", (dir.path() / "cache").string(), "--key", key.hex(), "--build-ms", "300",
                                    "--builds-file", builds.string(), "--out",
                                    (dir.path() / ("got" + std::to_string(i))).string()},
                                   dir.path(), i, "", barrier[0]));
  }
  ::close(barrier[0]);
  ::close(barrier[1]);  // EOF for every worker at once: the start signal
  int built_count = 0;
  for (int i = 0; i < kWorkers; ++i) {
    const WorkerResult r = workers[static_cast<std::size_t>(i)]->wait();
    INFO("worker " << i << " stderr: " << r.err);
    REQUIRE(r.exit_code == 0);
    if (r.out.find("built=1") != std::string::npos) ++built_count;
    CHECK_THAT(r.out, Catch::Contains("tier=writable"));
  }
  CHECK(line_count(builds) == 1);
  CHECK(built_count == 1);
  const std::string first = read_text(dir.path() / "got0");
  REQUIRE_FALSE(first.empty());
  for (int i = 1; i < kWorkers; ++i) CHECK(read_text(dir.path() / ("got" + std::to_string(i))) == first);
  CHECK(read_text(entry_file(dir.path() / "cache", key)) == first);
}

TEST_CASE("cubin store: threads of one process warming one key build it once", "[unit][cache][concurrency]") {
  TempDir dir;
  CubinStore store(root_options(dir.path()));
  const CacheKey key = key_n(21);
  std::atomic<int> builds{0};
  std::vector<std::thread> threads;
  std::vector<std::string> got(4);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      auto hit = store.get_or_build(key, [&] {
        ++builds;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        return make_entry(key);
      });
      got[static_cast<std::size_t>(i)] = hit.entry.cubin;
    });
  }
  for (auto& t : threads) t.join();
  CHECK(builds == 1);
  for (const auto& g : got) CHECK(g == make_entry(key).cubin);
}

TEST_CASE("cubin store: a publisher SIGKILLed mid-publish leaves no valid entry and no held lock",
          "[unit][cache][multiprocess][concurrency]") {
  const std::string point = GENERATE(as<std::string>{}, "tmp_opened", "tmp_half_written", "after_tmp_write",
                                     "after_tmp_fsync");
  INFO("crash point " << point);
  TempDir dir;
  const fs::path root = dir.path() / "cache";
  const CacheKey key = key_n(30);
  const fs::path builds = dir.path() / "builds";
  const std::vector<std::string> args{"--root", root.string(), "--key", key.hex(), "--builds-file", builds.string()};

  const WorkerResult crashed = run_worker(args, dir.path(), 0, point);
  REQUIRE(crashed.term_signal == SIGKILL);
  CHECK(line_count(builds) == 1);
  CHECK_FALSE(fs::exists(entry_file(root, key)));
  CHECK(files_in(root / "tmp").size() == 1);  // the evidence, removed once it is stale

  {
    CubinStore store(root_options(root));
    CHECK_FALSE(store.lookup(key).has_value());
    const auto t0 = std::chrono::steady_clock::now();
    auto lock = kiln::FileLock::try_lock(store.lock_path(key));
    CHECK(lock.has_value());
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(100));
  }

  const auto t0 = std::chrono::steady_clock::now();
  const WorkerResult next = run_worker(args, dir.path(), 1);
  INFO("next worker stderr: " << next.err);
  REQUIRE(next.exit_code == 0);
  CHECK_THAT(next.out, Catch::Contains("built=1"));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  CHECK(line_count(builds) == 2);
  CubinStore store(root_options(root));
  REQUIRE(store.lookup(key).has_value());

  // The killed publisher's temp file goes once it is older than stale_tmp_age.
  CubinStore::Options o = root_options(root);
  o.stale_tmp_age = std::chrono::seconds(0);
  for (const auto& f : files_in(root / "tmp")) set_mtime(f, std::chrono::seconds(10));
  CubinStore cleaner(o);
  CHECK(files_in(root / "tmp").empty());
}

TEST_CASE("cubin store: a publisher SIGKILLed just after the rename leaves a complete entry",
          "[unit][cache][multiprocess][concurrency]") {
  TempDir dir;
  const fs::path root = dir.path() / "cache";
  const CacheKey key = key_n(31);
  const std::vector<std::string> args{"--root", root.string(), "--key", key.hex()};
  REQUIRE(run_worker(args, dir.path(), 0, "after_rename").term_signal == SIGKILL);
  const WorkerResult next = run_worker(args, dir.path(), 1);
  REQUIRE(next.exit_code == 0);
  CHECK_THAT(next.out, Catch::Contains("built=0"));
}

TEST_CASE("cubin store: stale temp files are removed on open, fresh ones are kept", "[unit][cache]") {
  TempDir dir;
  { CubinStore init(root_options(dir.path())); }
  const fs::path stale = dir.path() / "tmp" / "dead.1.tmp";
  const fs::path fresh = dir.path() / "tmp" / "live.2.tmp";
  write_text(stale, "partial");
  write_text(fresh, "in flight");
  set_mtime(stale, std::chrono::hours(2));
  CubinStore store(root_options(dir.path()));
  CHECK_FALSE(fs::exists(stale));
  CHECK(fs::exists(fresh));
  CHECK(store.stats().temp_files == 1);
}

TEST_CASE("cubin store: read-only layers are searched first and never modified", "[unit][cache]") {
  TempDir dir;
  const fs::path ro1 = dir.path() / "prebuilt1";
  const fs::path ro2 = dir.path() / "prebuilt2";
  const fs::path root = dir.path() / "cache";
  const CacheKey shared = key_n(40), only_root = key_n(41), only_ro2 = key_n(42);
  {
    CubinStore(root_options(ro1)).publish(make_entry(shared, 'r'));
    CubinStore(root_options(ro2)).publish(make_entry(shared, 's'));
    CubinStore(root_options(ro2)).publish(make_entry(only_ro2, 't'));
    CubinStore(root_options(root)).publish(make_entry(shared, 'w'));
    CubinStore(root_options(root)).publish(make_entry(only_root, 'w'));
  }
  CubinStore::Options o = root_options(root);
  o.read_only_layers = {ro1, ro2};
  CubinStore store(o);

  auto hit = store.lookup(shared);
  REQUIRE(hit.has_value());
  CHECK(hit->tier == Tier::kReadOnly);
  CHECK(hit->file == entry_file(ro1, shared));
  CHECK(hit->entry.cubin == make_entry(shared, 'r').cubin);
  auto hit2 = store.lookup(only_ro2);
  REQUIRE(hit2.has_value());
  CHECK(hit2->file == entry_file(ro2, only_ro2));
  bool built = true;
  store.get_or_build(only_ro2, [&] { return make_entry(only_ro2); }, &built);
  CHECK_FALSE(built);
  CHECK_FALSE(fs::exists(entry_file(root, only_ro2)));  // a read-only hit is not copied
  auto hit3 = store.lookup(only_root);
  REQUIRE(hit3.has_value());
  CHECK(hit3->tier == Tier::kWritable);

  SECTION("a bad read-only entry is skipped with one warning and left in place") {
    const fs::path bad = entry_file(ro1, shared);
    std::string bytes = read_text(bad);
    bytes[bytes.size() - 30] ^= 1;
    write_text(bad, bytes);
    StderrCapture capture;
    auto h1 = store.lookup(shared);
    auto h2 = store.lookup(shared);
    const std::string warnings = capture.text();
    REQUIRE(h1.has_value());
    CHECK(h1->file == entry_file(ro2, shared));  // falls through to the next layer
    REQUIRE(h2.has_value());
    CHECK(count_of(warnings, "read-only cache entry") == 1);
    CHECK(read_text(bad) == bytes);
    CHECK(files_in(root / "quarantine").empty());

    const kiln::VerifyReport report = store.verify();
    CHECK(report.checked == 5);
    REQUIRE(report.bad.size() == 1);
    CHECK(report.bad[0].tier == Tier::kReadOnly);
    CHECK_FALSE(report.bad[0].quarantined);
    CHECK(fs::exists(bad));
  }
  SECTION("prune never touches read-only layers") {
    const auto ro_before = fs::file_size(entry_file(ro1, shared));
    const kiln::PruneReport report = store.prune(0);
    CHECK(report.removed_entries == 2);
    CHECK(report.remaining_bytes == 0);
    CHECK(fs::exists(entry_file(ro1, shared)));
    CHECK(fs::exists(entry_file(ro2, shared)));
    CHECK(fs::exists(entry_file(ro2, only_ro2)));
    CHECK(fs::file_size(entry_file(ro1, shared)) == ro_before);
    CHECK_FALSE(fs::exists(entry_file(root, only_root)));
  }
  SECTION("list and stats cover every layer") {
    const auto listed = store.list();
    REQUIRE(listed.size() == 5);
    CHECK(listed[0].tier == Tier::kReadOnly);
    CHECK(listed[0].layer == ro1);
    CHECK(listed[0].key_hex == shared.hex());
    CHECK(listed[0].semantic_key == make_entry(shared).semantic_key);
    CHECK(listed[0].problem.empty());
    CHECK(listed[0].bytes == fs::file_size(entry_file(ro1, shared)));
    CHECK(std::count_if(listed.begin(), listed.end(), [](auto& e) { return e.tier == Tier::kWritable; }) == 2);
    const kiln::StoreStats s = store.stats();
    REQUIRE(s.layers.size() == 3);
    CHECK(s.layers[0].entries == 1);
    CHECK(s.layers[1].entries == 2);
    CHECK(s.layers[2].tier == Tier::kWritable);
    CHECK(s.layers[2].entries == 2);
    CHECK(s.layers[2].bytes == fs::file_size(entry_file(root, shared)) + fs::file_size(entry_file(root, only_root)));
    CHECK(s.writable);
    CHECK(s.quarantined == 0);
  }
}

TEST_CASE("cubin store: prune removes least recently used writable entries first", "[unit][cache]") {
  TempDir dir;
  CubinStore store(root_options(dir.path()));
  std::vector<CacheKey> keys;
  for (int i = 0; i < 5; ++i) {
    keys.push_back(key_n(static_cast<std::uint64_t>(50 + i)));
    REQUIRE(store.publish(make_entry(keys.back())));
  }
  const std::uint64_t one = fs::file_size(entry_file(dir.path(), keys[0]));
  // keys[0] is the oldest publish, but a hit makes it the most recently used.
  for (int i = 0; i < 5; ++i) set_mtime(entry_file(dir.path(), keys[static_cast<std::size_t>(i)]), std::chrono::hours(5 - i));
  const auto before = mtime_of(entry_file(dir.path(), keys[0]));
  REQUIRE(store.lookup(keys[0]).has_value());
  CHECK(mtime_of(entry_file(dir.path(), keys[0])) > before + std::chrono::hours(1));

  // Quarantined files go first: they are never served.
  write_text(entry_file(dir.path(), keys[4]), "junk");
  {
    StderrCapture capture;
    CHECK_FALSE(store.lookup(keys[4]).has_value());
    CHECK_THAT(capture.text(), Catch::Contains("is bad"));
  }
  CHECK(store.stats().quarantined == 1);

  const kiln::PruneReport report = store.prune(2 * one);
  CHECK(report.removed_quarantined == 1);
  CHECK(report.removed_entries == 2);
  CHECK(report.remaining_entries == 2);
  CHECK(report.remaining_bytes == 2 * one);
  CHECK_FALSE(fs::exists(entry_file(dir.path(), keys[1])));
  CHECK_FALSE(fs::exists(entry_file(dir.path(), keys[2])));
  CHECK(fs::exists(entry_file(dir.path(), keys[3])));
  CHECK(fs::exists(entry_file(dir.path(), keys[0])));
  CHECK(store.stats().quarantined == 0);
  CHECK(store.prune(10 * one).removed_entries == 0);
}

TEST_CASE("cubin store: verify re-checks every entry and quarantines bad writable ones", "[unit][cache]") {
  TempDir dir;
  CubinStore store(root_options(dir.path()));
  for (int i = 0; i < 4; ++i) REQUIRE(store.publish(make_entry(key_n(static_cast<std::uint64_t>(60 + i)))));
  const fs::path bad = entry_file(dir.path(), key_n(61));
  std::string bytes = read_text(bad);
  bytes[bytes.size() - 40] ^= 4;
  write_text(bad, bytes);
  // A foreign file in the entries tree is reported too.
  fs::create_directories(dir.path() / "entries" / "00");
  write_text(dir.path() / "entries" / "00" / "notes.txt", "x");

  StderrCapture capture;
  const kiln::VerifyReport report = store.verify();
  capture.text();
  CHECK(report.checked == 5);
  REQUIRE(report.bad.size() == 2);
  CHECK_FALSE(report.ok());
  bool saw_checksum = false;
  for (const auto& b : report.bad) {
    CHECK(b.quarantined);
    if (b.reason == "checksum mismatch") saw_checksum = b.file == bad;
  }
  CHECK(saw_checksum);
  CHECK_FALSE(fs::exists(bad));
  CHECK(store.stats().quarantined == 2);
  CHECK(store.verify().ok());
}

TEST_CASE("cubin store: an unwritable cache directory degrades to memory with one warning", "[unit][cache]") {
  TempDir dir;
  SECTION("root below a regular file (mkdir fails even for root)") {
    write_text(dir.path() / "a_file", "x");
    CubinStore store(root_options(dir.path() / "a_file" / "cache"));
    CHECK_FALSE(store.writable());
    StderrCapture capture;
    int builds = 0;
    for (int i = 0; i < 3; ++i) {
      bool built = false;
      auto hit = store.get_or_build(key_n(70), [&] { ++builds; return make_entry(key_n(70)); }, &built);
      CHECK(built);
      CHECK(hit.tier == Tier::kMemory);
      CHECK(hit.file.empty());
      CHECK(hit.entry.cubin == make_entry(key_n(70)).cubin);
    }
    CHECK_FALSE(store.publish(make_entry(key_n(71))));
    const std::string warnings = capture.text();
    CHECK(builds == 3);
    CHECK(count_of(warnings, "is not writable") == 1);
    CHECK_THAT(warnings, Catch::Contains("memory only"));
    CHECK(store.list().empty());
    CHECK(store.verify().ok());
    CHECK(store.prune(0).removed_entries == 0);
    CHECK_FALSE(store.stats().writable);
  }
  SECTION("read-only layers still serve when the root is unwritable") {
    const CacheKey key = key_n(72);
    REQUIRE(CubinStore(root_options(dir.path() / "ro")).publish(make_entry(key)));
    write_text(dir.path() / "a_file", "x");
    CubinStore::Options o = root_options(dir.path() / "a_file" / "cache");
    o.read_only_layers = {dir.path() / "ro"};
    CubinStore store(o);
    StderrCapture capture;
    bool built = true;
    auto hit = store.get_or_build(key, [&] { return make_entry(key); }, &built);
    CHECK_FALSE(built);
    CHECK(hit.tier == Tier::kReadOnly);
    CHECK(capture.text().empty());  // nothing needed writing, so nothing to warn about
  }
  for (int err : {EROFS, ENOSPC, EDQUOT, EACCES}) {
    for (const char* point : {"tmp_opened", "after_tmp_write", "after_tmp_fsync"}) {
      DYNAMIC_SECTION("publish failing with " << std::strerror(err) << " at " << point) {
        CubinStore::Options o = root_options(dir.path() / "cache");
        const std::string at = point;
        o.fault_hook = [err, at](std::string_view p) {
          if (p == at) throw std::system_error(err, std::generic_category(), "injected");
        };
        CubinStore store(o);
        REQUIRE(store.writable());
        StderrCapture capture;
        bool built = false;
        auto hit = store.get_or_build(key_n(73), [&] { return make_entry(key_n(73)); }, &built);
        CHECK(built);
        CHECK(hit.tier == Tier::kMemory);
        CHECK_FALSE(store.writable());
        CHECK_FALSE(store.publish(make_entry(key_n(74))));
        store.get_or_build(key_n(75), [&] { return make_entry(key_n(75)); });
        const std::string warnings = capture.text();
        CHECK(count_of(warnings, "is not writable") == 1);
        CHECK_THAT(warnings, Catch::Contains(std::strerror(err)));
        CHECK(files_in(dir.path() / "cache" / "tmp").empty());  // the temp file was cleaned up
        CHECK_FALSE(fs::exists(entry_file(dir.path() / "cache", key_n(73))));
      }
    }
  }
}

TEST_CASE("file lock: excludes other holders, including other threads, and releases on destruction",
          "[unit][cache][concurrency]") {
  TempDir dir;
  const fs::path p = dir.path() / "k.lock";
  {
    kiln::FileLock held(p);
    CHECK_FALSE(kiln::FileLock::try_lock(p).has_value());
    bool other_got_it = true;
    std::thread t([&] { other_got_it = kiln::FileLock::try_lock(p).has_value(); });
    t.join();
    CHECK_FALSE(other_got_it);
    kiln::FileLock moved = std::move(held);
    CHECK_FALSE(kiln::FileLock::try_lock(p).has_value());
  }
  CHECK(kiln::FileLock::try_lock(p).has_value());
  CHECK(fs::exists(p));  // never deleted: see file_lock.h
  CHECK_THROWS_AS(kiln::FileLock(dir.path() / "missing_dir" / "k.lock"), kiln::Error);
}

TEST_CASE("cubin store: a cache directory wiped while the store is open is recreated on publish",
          "[unit][cache]") {
  TempDir dir;
  const fs::path root = dir.path() / "cache";
  CubinStore store(root_options(root));
  fs::remove_all(root);
  bool built = false;
  auto hit = store.get_or_build(key_n(80), [&] { return make_entry(key_n(80)); }, &built);
  CHECK(built);
  CHECK(hit.tier == Tier::kWritable);
  CHECK(store.writable());
  CHECK(store.lookup(key_n(80)).has_value());
}
