#include "kiln/cache/cubin_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

#include <fmt/format.h>

#include "kiln/cache/file_lock.h"
#include "kiln/cache/remote_store.h"
#include "kiln/jit/error.h"
#include "kiln/jit/log.h"

namespace kiln {

namespace fs = std::filesystem;

std::string_view tier_name(Tier tier) {
  switch (tier) {
    case Tier::kReadOnly: return "read_only";
    case Tier::kWritable: return "writable";
    case Tier::kMemory: return "memory";
  }
  return "unknown";
}

namespace {

constexpr std::string_view kEntrySuffix = ".kiln";
// Larger than any cubin kiln produces by far; a bigger file is not ours and is never read whole.
constexpr std::uint64_t kMaxEntryFileBytes = std::uint64_t{1} << 30;
// A hit refreshes the mtime (prune's LRU clock) only when it is older than this, so hot hits cost
// no write syscall; prune's recency is therefore coarse by this much.
constexpr std::chrono::seconds kTouchGranularity{60};

// A failed step of publish: which step and its errno.
struct IoFailure {
  std::string step;
  int err;
};

std::chrono::system_clock::time_point to_time_point(const struct timespec& ts) {
  return std::chrono::system_clock::time_point(std::chrono::duration_cast<std::chrono::system_clock::duration>(
      std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec)));
}

void close_quietly(int fd) {
  if (fd >= 0) ::close(fd);
}

// Reads up to `limit` bytes from the start of fd; fewer if the file is shorter (or shrank).
bool read_prefix(int fd, std::uint64_t limit, std::string& out, int& err) {
  out.resize(static_cast<std::size_t>(limit));
  std::size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::pread(fd, out.data() + got, out.size() - got, static_cast<off_t>(got));
    if (n < 0) {
      if (errno == EINTR) continue;
      err = errno;
      return false;
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  out.resize(got);
  return true;
}

void write_all(int fd, std::string_view bytes, const char* step) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      throw IoFailure{step, errno};
    }
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
}

// fsync of a directory makes the names in it (our rename) durable; without it a power loss can
// forget a rename that already returned. Best effort: the entry is checksummed either way.
void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  if (::fsync(fd) != 0) log_debug("fsync of directory {} failed: {}", dir.string(), std::strerror(errno));
  ::close(fd);
}

std::string unique_suffix() {
  static std::atomic<std::uint64_t> counter{0};
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return fmt::format("{}.{}.{}", std::chrono::duration_cast<std::chrono::nanoseconds>(now).count(), ::getpid(),
                     counter.fetch_add(1));
}

// Calls fn(key, file, stat) for every <2 hex>/<32 hex>.kiln under layer/entries, and
// bad(file, reason) for anything else found there.
template <typename Fn, typename BadFn>
void for_each_entry_file(const fs::path& layer, Fn&& fn, BadFn&& bad) {
  std::error_code ec;
  for (fs::directory_iterator shard(layer / "entries", ec), end; !ec && shard != end; shard.increment(ec)) {
    std::error_code sec;
    if (!shard->is_directory(sec)) continue;
    const std::string shard_name = shard->path().filename().string();
    for (fs::directory_iterator it(shard->path(), sec); !sec && it != end; it.increment(sec)) {
      const fs::path file = it->path();
      const std::string name = file.filename().string();
      struct stat st {};
      if (::stat(file.c_str(), &st) != 0) continue;  // vanished (pruned or quarantined meanwhile)
      std::optional<CacheKey> key;
      if (name.size() == 32 + kEntrySuffix.size() && name.ends_with(kEntrySuffix)) {
        key = CacheKey::parse_hex(std::string_view(name).substr(0, 32));
        if (key && key->hex() != name.substr(0, 32)) key.reset();  // upper case: lookup never opens it
      }
      if (!key) {
        bad(file, st, "file name is not <32 hex digits>.kiln; kiln never writes such a file here");
      } else if (shard_name != name.substr(0, 2)) {
        bad(file, st, fmt::format("entry is misfiled under entries/{}/ (lookup would never find it)", shard_name));
      } else {
        fn(*key, file, st);
      }
    }
  }
}

}  // namespace

struct CubinStore::ReadResult {
  enum class Status { kMissing, kGood, kBad } status = Status::kMissing;
  std::optional<CacheEntry> entry;
  std::string reason;  // for kBad
  dev_t dev = 0;       // identity of the file we judged, so quarantine moves only that file
  ino_t ino = 0;
  bool have_identity = false;
};

CubinStore::CubinStore(Options options) : options_(std::move(options)) {
  if (options_.root.empty()) {
    open_failure_ = "no writable cache directory configured";
    return;
  }
  for (const char* sub : {"entries", "locks", "quarantine", "tmp"}) {
    std::error_code ec;
    fs::create_directories(options_.root / sub, ec);
    if (ec) {
      open_failure_ = fmt::format("cannot create {}: {}", (options_.root / sub).string(), ec.message());
      return;
    }
  }
  writable_ = true;
  remove_stale_temp_files();
}

fs::path CubinStore::entry_path(const fs::path& layer, const CacheKey& key) {
  const std::string hex = key.hex();
  return layer / "entries" / hex.substr(0, 2) / (hex + std::string(kEntrySuffix));
}

fs::path CubinStore::lock_path(const CacheKey& key) const { return options_.root / "locks" / (key.hex() + ".lock"); }

void CubinStore::fault(std::string_view point) const {
  if (!options_.fault_hook) return;
  try {
    options_.fault_hook(point);
  } catch (const std::system_error& e) {
    throw IoFailure{std::string(point), e.code().value()};
  }
}

void CubinStore::remove_stale_temp_files() const {
  const auto cutoff = std::chrono::system_clock::now() - options_.stale_tmp_age;
  std::error_code ec;
  for (fs::directory_iterator it(options_.root / "tmp", ec), end; !ec && it != end; it.increment(ec)) {
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (to_time_point(st.st_mtim) < cutoff) {
      if (::unlink(it->path().c_str()) == 0) log_debug("removed stale temp file {}", it->path().string());
    }
  }
}

CubinStore::ReadResult CubinStore::read_entry_file(const fs::path& file, const CacheKey& key, bool touch) const {
  ReadResult result;
  int fd;
  do {
    fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return result;  // a plain miss
    result.status = ReadResult::Status::kBad;
    result.reason = fmt::format("cannot open: {}", std::strerror(errno));
    return result;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    result.status = ReadResult::Status::kBad;
    result.reason = fmt::format("cannot stat: {}", std::strerror(errno));
    ::close(fd);
    return result;
  }
  result.dev = st.st_dev;
  result.ino = st.st_ino;
  result.have_identity = true;
  result.status = ReadResult::Status::kBad;
  if (!S_ISREG(st.st_mode)) {
    result.reason = "not a regular file";
  } else if (static_cast<std::uint64_t>(st.st_size) > kMaxEntryFileBytes) {
    result.reason = fmt::format("file is {} bytes, larger than any entry kiln writes", st.st_size);
  } else {
    std::string bytes;
    int err = 0;
    if (!read_prefix(fd, static_cast<std::uint64_t>(st.st_size), bytes, err)) {
      result.reason = fmt::format("read failed: {}", std::strerror(err));
    } else {
      try {
        result.entry = decode_entry(bytes, key);
        result.status = ReadResult::Status::kGood;
      } catch (const Error& e) {
        result.reason = e.details().log.empty() ? e.what() : e.details().log;
      }
    }
  }
  if (touch && result.status == ReadResult::Status::kGood &&
      std::chrono::system_clock::now() - to_time_point(st.st_mtim) > kTouchGranularity) {
    ::futimens(fd, nullptr);  // best effort: a failed touch only makes prune's LRU less precise
  }
  ::close(fd);
  return result;
}

void CubinStore::quarantine(const fs::path& file, const ReadResult& bad) {
  const fs::path qdir = options_.root / "quarantine";
  const fs::path dest = qdir / fmt::format("{}.{}.bad", file.filename().string(), unique_suffix());
  std::error_code ec;
  fs::create_directories(qdir, ec);
  if (::rename(file.c_str(), dest.c_str()) != 0) {
    const int err = errno;
    if (err == ENOENT) return;  // another reader already moved it
    if (first_warning_for(file)) {
      log_warn("cache entry {} is bad ({}); it could not be moved to quarantine ({}), so it is ignored and rebuilt",
               file.string(), bad.reason, std::strerror(err));
    }
    return;
  }
  // Between our read and the rename, a publisher may have replaced the bad file with a good one
  // (publish renames a new inode into place). If that is what we moved, put it back.
  struct stat st {};
  if (bad.have_identity && ::stat(dest.c_str(), &st) == 0 && (st.st_ino != bad.ino || st.st_dev != bad.dev)) {
    ::rename(dest.c_str(), file.c_str());
    return;
  }
  const std::string sidecar = dest.string() + ".reason";
  const int fd = ::open(sidecar.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd >= 0) {
    const std::string text = fmt::format("{}\nfrom {}\n", bad.reason, file.string());
    [[maybe_unused]] const ssize_t n = ::write(fd, text.data(), text.size());  // best effort
    ::close(fd);
  }
  log_warn("cache entry {} is bad ({}); moved to {} and it will be rebuilt", file.string(), bad.reason, dest.string());
}

bool CubinStore::first_warning_for(const fs::path& file) {
  std::lock_guard<std::mutex> lock(warned_mutex_);
  return warned_files_.insert(file).second;
}

void CubinStore::warn_read_only_bad(const fs::path& file, const std::string& reason) {
  if (!first_warning_for(file)) return;
  log_warn("read-only cache entry {} is bad ({}); skipping it (kiln does not modify read-only layers; rebuild "
           "that prebuilt cache)",
           file.string(), reason);
}

std::optional<CubinStore::Hit> CubinStore::lookup(const CacheKey& key) {
  for (const fs::path& layer : options_.read_only_layers) {
    const fs::path file = entry_path(layer, key);
    ReadResult r = read_entry_file(file, key, /*touch=*/false);
    if (r.status == ReadResult::Status::kGood) return Hit{std::move(*r.entry), Tier::kReadOnly, file};
    if (r.status == ReadResult::Status::kBad) warn_read_only_bad(file, r.reason);
  }
  if (options_.root.empty()) return std::nullopt;
  const fs::path file = entry_path(options_.root, key);
  ReadResult r = read_entry_file(file, key, /*touch=*/true);
  if (r.status == ReadResult::Status::kGood) return Hit{std::move(*r.entry), Tier::kWritable, file};
  if (r.status == ReadResult::Status::kBad) quarantine(file, r);
  return std::nullopt;
}

void CubinStore::disable_writes(const std::string& why) {
  writable_ = false;
  if (!warned_unwritable_.exchange(true)) {
    log_warn("cache dir {} is not writable ({}); kiln keeps compiled kernels in memory only", options_.root.string(),
             why);
  }
}

bool CubinStore::publish(const CacheEntry& entry) {
  if (!writable()) {
    if (!open_failure_.empty() && !options_.root.empty()) disable_writes(open_failure_);
    return false;
  }
  const std::string bytes = encode_entry(entry);
  const fs::path final_path = entry_path(options_.root, entry.key);
  const fs::path shard = final_path.parent_path();
  const fs::path tmp = options_.root / "tmp" / fmt::format("{}.{}.tmp", entry.key.hex(), unique_suffix());
  int fd = -1;
  try {
    // Directories are (re)created here too, so a cache dir wiped while we run is rebuilt, not abandoned.
    std::error_code ec;
    const bool new_shard = fs::create_directories(shard, ec);
    if (ec) throw IoFailure{"create " + shard.string(), ec.value()};
    fs::create_directories(tmp.parent_path(), ec);
    if (ec) throw IoFailure{"create " + tmp.parent_path().string(), ec.value()};
    do {
      fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) throw IoFailure{"create temp file " + tmp.string(), errno};
    fault("tmp_opened");
    const std::string_view all(bytes);
    write_all(fd, all.substr(0, all.size() / 2), "write temp file");
    fault("tmp_half_written");
    write_all(fd, all.substr(all.size() / 2), "write temp file");
    fault("after_tmp_write");
    // The data must be on disk before the name points at it, or a crash after the rename could
    // leave a complete-looking name over empty or partial contents.
    if (::fsync(fd) != 0) throw IoFailure{"fsync temp file", errno};
    fault("after_tmp_fsync");
    const int to_close = fd;
    fd = -1;
    if (::close(to_close) != 0) throw IoFailure{"close temp file", errno};
    // rename within one file system is atomic: readers see the old state or the whole new entry.
    if (::rename(tmp.c_str(), final_path.c_str()) != 0) throw IoFailure{"rename into " + shard.string(), errno};
    fault("after_rename");
    fsync_dir(shard);
    if (new_shard) fsync_dir(shard.parent_path());
    fault("after_dir_fsync");
  } catch (const IoFailure& f) {
    close_quietly(fd);
    ::unlink(tmp.c_str());
    disable_writes(fmt::format("{}: {}", f.step, std::strerror(f.err)));
    return false;
  } catch (...) {  // a fault hook may throw anything; leave no temp file behind
    close_quietly(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  return true;
}

CubinStore::Hit CubinStore::get_or_build(const CacheKey& key, const std::function<CacheEntry()>& build, bool* built) {
  if (built) *built = false;
  if (auto hit = lookup(key)) return std::move(*hit);

  std::optional<FileLock> lock;
  if (writable()) {
    try {
      std::error_code ec;
      fs::create_directories(options_.root / "locks", ec);  // failure surfaces as the lock's error
      lock.emplace(lock_path(key));
    } catch (const Error& e) {
      // A lock file that cannot even be created means the root is not writable: say that once,
      // as the memory-only warning, instead of warning about locking too.
      // Without the lock several processes may compile the same key; each result is still valid.
      disable_writes(e.what());
    }
  }
  // Another process may have published while we waited for the lock.
  if (lock) {
    if (auto hit = lookup(key)) return std::move(*hit);
  }

  bool remote_hit = false;
  CacheEntry entry = options_.remote ? options_.remote->get_or_build(key, build, &remote_hit) : build();
  if (built) *built = !remote_hit;
  if (!(entry.key == key)) {
    throw Error(ErrorCode::kInternal,
                fmt::format("the build function for key {} returned an entry for key {}", key.hex(), entry.key.hex()),
                ErrorDetails{key.hex(), "", ""});
  }
  if (publish(entry)) {
    fs::path file = entry_path(options_.root, key);
    return Hit{std::move(entry), Tier::kWritable, std::move(file), remote_hit};
  }
  return Hit{std::move(entry), Tier::kMemory, {}, remote_hit};
}

std::vector<ListedEntry> CubinStore::list() const {
  std::vector<ListedEntry> out;
  auto list_layer = [&](const fs::path& layer, Tier tier) {
    auto add = [&](const fs::path& file, const struct stat& st, std::string problem, std::string semantic) {
      ListedEntry e;
      e.key_hex = file.stem().string();
      e.semantic_key = std::move(semantic);
      e.problem = std::move(problem);
      e.bytes = static_cast<std::uint64_t>(st.st_size);
      e.tier = tier;
      e.layer = layer;
      e.file = file;
      e.mtime = to_time_point(st.st_mtim);
      out.push_back(std::move(e));
    };
    for_each_entry_file(
        layer,
        [&](const CacheKey& key, const fs::path& file, const struct stat& st) {
          std::string problem, semantic;
          const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
          std::string prefix;
          int err = 0;
          if (fd < 0 || !read_prefix(fd, std::min<std::uint64_t>(st.st_size, kEntryHeaderMaxBytes), prefix, err)) {
            problem = fmt::format("cannot read: {}", std::strerror(fd < 0 ? errno : err));
          } else {
            try {
              EntryHeader h = decode_entry_header(prefix);
              if (!(h.key == key)) problem = fmt::format("key echo mismatch: holds key {}", h.key.hex());
              semantic = std::move(h.semantic_key);
            } catch (const Error& e) {
              problem = e.details().log;
            }
          }
          close_quietly(fd);
          add(file, st, std::move(problem), std::move(semantic));
        },
        [&](const fs::path& file, const struct stat& st, const std::string& reason) { add(file, st, reason, ""); });
  };
  for (const fs::path& layer : options_.read_only_layers) list_layer(layer, Tier::kReadOnly);
  if (!options_.root.empty()) list_layer(options_.root, Tier::kWritable);
  return out;
}

VerifyReport CubinStore::verify() {
  VerifyReport report;
  auto verify_layer = [&](const fs::path& layer, Tier tier) {
    auto record_bad = [&](const fs::path& file, const ReadResult& r) {
      BadEntry bad{file, tier, r.reason, false};
      if (tier == Tier::kWritable) {
        quarantine(file, r);
        std::error_code ec;
        bad.quarantined = !fs::exists(file, ec);
      }
      report.bad.push_back(std::move(bad));
    };
    for_each_entry_file(
        layer,
        [&](const CacheKey& key, const fs::path& file, const struct stat&) {
          ++report.checked;
          ReadResult r = read_entry_file(file, key, /*touch=*/false);
          if (r.status == ReadResult::Status::kBad) record_bad(file, r);
        },
        [&](const fs::path& file, const struct stat& st, const std::string& reason) {
          ++report.checked;
          ReadResult r;
          r.status = ReadResult::Status::kBad;
          r.reason = reason;
          r.dev = st.st_dev;
          r.ino = st.st_ino;
          r.have_identity = true;
          record_bad(file, r);
        });
  };
  for (const fs::path& layer : options_.read_only_layers) verify_layer(layer, Tier::kReadOnly);
  if (!options_.root.empty()) verify_layer(options_.root, Tier::kWritable);
  return report;
}

PruneReport CubinStore::prune(std::uint64_t max_bytes) {
  PruneReport report;
  if (options_.root.empty()) return report;
  std::error_code ec;
  // Quarantined files are never served; they only take space.
  for (fs::directory_iterator it(options_.root / "quarantine", ec), end; !ec && it != end; it.increment(ec)) {
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (::unlink(it->path().c_str()) == 0) {
      report.freed_bytes += static_cast<std::uint64_t>(st.st_size);
      if (it->path().extension() == ".bad") ++report.removed_quarantined;
    }
  }
  struct Candidate {
    fs::path file;
    std::uint64_t bytes;
    struct timespec mtime;
  };
  std::vector<Candidate> entries;
  std::uint64_t total = 0;
  for_each_entry_file(
      options_.root,
      [&](const CacheKey&, const fs::path& file, const struct stat& st) {
        entries.push_back({file, static_cast<std::uint64_t>(st.st_size), st.st_mtim});
        total += static_cast<std::uint64_t>(st.st_size);
      },
      [&](const fs::path& file, const struct stat& st, const std::string&) {
        entries.push_back({file, static_cast<std::uint64_t>(st.st_size), st.st_mtim});
        total += static_cast<std::uint64_t>(st.st_size);
      });
  std::sort(entries.begin(), entries.end(), [](const Candidate& a, const Candidate& b) {
    if (a.mtime.tv_sec != b.mtime.tv_sec) return a.mtime.tv_sec < b.mtime.tv_sec;
    if (a.mtime.tv_nsec != b.mtime.tv_nsec) return a.mtime.tv_nsec < b.mtime.tv_nsec;
    return a.file < b.file;
  });
  std::size_t kept_from = 0;
  // Deleting without the key's lock is safe: a reader holding the file open keeps its bytes, and
  // one that opens after the unlink sees a plain miss and rebuilds.
  while (total > max_bytes && kept_from < entries.size()) {
    const Candidate& c = entries[kept_from++];
    if (::unlink(c.file.c_str()) == 0) {
      ++report.removed_entries;
      report.freed_bytes += c.bytes;
    }
    total -= c.bytes;  // gone either way (ENOENT: someone else removed it)
  }
  report.remaining_entries = entries.size() - kept_from;
  report.remaining_bytes = total;
  return report;
}

StoreStats CubinStore::stats() const {
  StoreStats s;
  s.writable = writable();
  auto layer_stats = [&](const fs::path& layer, Tier tier) {
    LayerStats ls;
    ls.root = layer;
    ls.tier = tier;
    std::error_code ec;
    ls.present = fs::is_directory(layer / "entries", ec);
    auto count = [&](const fs::path&, const struct stat& st) {
      ++ls.entries;
      ls.bytes += static_cast<std::uint64_t>(st.st_size);
    };
    for_each_entry_file(
        layer, [&](const CacheKey&, const fs::path& f, const struct stat& st) { count(f, st); },
        [&](const fs::path& f, const struct stat& st, const std::string&) { count(f, st); });
    s.layers.push_back(std::move(ls));
  };
  for (const fs::path& layer : options_.read_only_layers) layer_stats(layer, Tier::kReadOnly);
  if (options_.root.empty()) return s;
  layer_stats(options_.root, Tier::kWritable);
  std::error_code ec;
  for (fs::directory_iterator it(options_.root / "quarantine", ec), end; !ec && it != end; it.increment(ec)) {
    struct stat st {};
    if (it->path().extension() != ".bad" || ::lstat(it->path().c_str(), &st) != 0) continue;
    ++s.quarantined;
    s.quarantined_bytes += static_cast<std::uint64_t>(st.st_size);
  }
  for (fs::directory_iterator it(options_.root / "tmp", ec), end; !ec && it != end; it.increment(ec)) ++s.temp_files;
  return s;
}

}  // namespace kiln
