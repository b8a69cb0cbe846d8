#include "kiln/cache/file_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "kiln/jit/error.h"

namespace kiln {

namespace {

int open_lock_file(const std::filesystem::path& path) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int err = errno;
    throw Error(ErrorCode::kCacheIo,
                fmt::format("cannot open lock file ({}); check that the cache directory is writable", std::strerror(err)),
                ErrorDetails{"", path.string(), ""});
  }
  return fd;
}

// Returns true when locked, false when `nonblocking` and someone else holds it.
bool lock_fd(int fd, const std::filesystem::path& path, bool nonblocking) {
  int rc;
  do {
    rc = ::flock(fd, LOCK_EX | (nonblocking ? LOCK_NB : 0));
  } while (rc != 0 && errno == EINTR);
  if (rc == 0) return true;
  const int err = errno;
  if (nonblocking && err == EWOULDBLOCK) return false;
  ::close(fd);
  throw Error(ErrorCode::kCacheIo,
              fmt::format("cannot lock ({}); the cache directory may be on a file system without flock support",
                          std::strerror(err)),
              ErrorDetails{"", path.string(), ""});
}

}  // namespace

FileLock::FileLock(const std::filesystem::path& path) : path_(path), fd_(open_lock_file(path)) {
  lock_fd(fd_, path_, /*nonblocking=*/false);
}

std::optional<FileLock> FileLock::try_lock(const std::filesystem::path& path) {
  const int fd = open_lock_file(path);
  if (!lock_fd(fd, path, /*nonblocking=*/true)) {
    ::close(fd);
    return std::nullopt;
  }
  return FileLock(path, fd);
}

FileLock::FileLock(FileLock&& other) noexcept : path_(std::move(other.path_)), fd_(other.fd_) { other.fd_ = -1; }

FileLock& FileLock::operator=(FileLock&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

FileLock::~FileLock() { release(); }

// Closing the descriptor releases the flock; no explicit LOCK_UN is needed.
void FileLock::release() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

}  // namespace kiln
