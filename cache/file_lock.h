#pragma once
// FileLock: an exclusive flock() on a lock file, held for the lifetime of the object.
//
// flock rather than "create a lock file, delete it when done": the kernel drops a flock when its
// holder dies (even by SIGKILL), so a crashed process never leaves a lock that blocks the next one.
// The lock file itself is never deleted: unlinking it while another process waits on it would let
// a third process lock a fresh file of the same name, and two "exclusive" holders would coexist.
//
// Each FileLock opens its own descriptor, so it also excludes other threads of the same process.
#include <filesystem>
#include <optional>

namespace kiln {

class FileLock {
 public:
  // Blocks until the lock is held. Creates the file if needed. Throws Error(kCacheIo) if the file
  // cannot be opened or locked.
  explicit FileLock(const std::filesystem::path& path);
  // Returns nullopt if another holder has it; throws Error(kCacheIo) like the constructor.
  static std::optional<FileLock> try_lock(const std::filesystem::path& path);

  FileLock(FileLock&& other) noexcept;
  FileLock& operator=(FileLock&& other) noexcept;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock();

  const std::filesystem::path& path() const { return path_; }

 private:
  FileLock(std::filesystem::path path, int fd) : path_(std::move(path)), fd_(fd) {}
  void release() noexcept;

  std::filesystem::path path_;
  int fd_ = -1;
};

}  // namespace kiln
