#include "tests/support/redis_server.h"

#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <system_error>
#include <thread>

#include <fmt/format.h>

#include "kiln/jit/error.h"

namespace kiln::testing {

namespace fs = std::filesystem;

namespace {

// A port the kernel considers free right now. Another process may still take it before the
// server binds it; start() then fails that attempt and tries another port.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    throw std::runtime_error("cannot find a free port: bind/getsockname failed");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace

std::string RedisServer::binary() {
  if (const char* p = std::getenv("KILN_REDIS_SERVER"); p && *p) return p;
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= dirs.size()) {
    const std::size_t end = std::min(dirs.find(':', start), dirs.size());
    const fs::path candidate = fs::path(dirs.substr(start, end - start)) / "redis-server";
    if (end > start && ::access(candidate.c_str(), X_OK) == 0) return candidate.string();
    start = end + 1;
  }
  return "";
}

RedisServer::RedisServer(std::vector<std::string> extra, std::string admin_password)
    : extra_(std::move(extra)), admin_password_(std::move(admin_password)) {
  if (binary().empty()) throw std::runtime_error("redis-server not found (install redis-server or set KILN_REDIS_SERVER)");
  std::string tmpl = (fs::temp_directory_path() / "kiln_redis.XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  dir_ = tmpl;
  for (int attempt = 0; attempt < 20; ++attempt) {
    port_ = free_port();
    if (try_start()) return;
  }
  std::error_code ec;
  fs::remove_all(dir_, ec);
  throw std::runtime_error("redis-server did not start on any of 20 free ports; see its log in " + dir_.string());
}

RedisServer::~RedisServer() {
  if (pid_ > 0) {
    ::kill(pid_, SIGCONT);  // a stopped process still dies of SIGKILL, but be plain about it
    kill();
  }
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

std::string RedisServer::url() const { return fmt::format("redis://127.0.0.1:{}", port_); }

RedisEndpoint RedisServer::endpoint() const {
  RedisEndpoint e;
  e.host = "127.0.0.1";
  e.port = port_;
  return e;
}

bool RedisServer::try_start() {
  const std::string bin = binary();
  std::vector<std::string> args = {bin,         "--port",           std::to_string(port_), "--bind", "127.0.0.1",
                                   "--save",    "",                 "--appendonly",        "no",     "--dir",
                                   dir_.string(), "--logfile",      (dir_ / "redis.log").string(),
                                   "--protected-mode", "no",        "--daemonize",         "no",     "--loglevel",
                                   "warning"};
  args.insert(args.end(), extra_.begin(), extra_.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);  // the parent died before prctl
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  pid_ = pid;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {  // exited: port taken, or bad arguments
      pid_ = -1;
      return false;
    }
    try {
      if (command({"PING"}).str == "PONG") return true;
    } catch (const std::exception&) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill();
  return false;
}

void RedisServer::kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
}

void RedisServer::stop() {
  if (pid_ > 0) ::kill(pid_, SIGSTOP);
}

void RedisServer::resume() {
  if (pid_ > 0) ::kill(pid_, SIGCONT);
}

void RedisServer::start() {
  kill();
  // The same port, which a client may be hammering meanwhile; retry briefly if the bind races.
  for (int attempt = 0; attempt < 50; ++attempt) {
    if (try_start()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  throw std::runtime_error(fmt::format("redis-server did not restart on port {}", port_));
}

RedisReply RedisServer::command(const std::vector<std::string>& args) const {
  RedisEndpoint e = endpoint();
  e.password = admin_password_;
  RedisConnection c(e, std::chrono::seconds(1), std::chrono::seconds(1));
  std::vector<std::string_view> views(args.begin(), args.end());
  return c.command(views);
}

}  // namespace kiln::testing
