#pragma once
// A private redis-server for tests: 127.0.0.1, a free port, no persistence, killed (SIGKILL) with
// this object, and also when the test process dies (PR_SET_PDEATHSIG), so no run leaves a server
// behind. PR_SET_PDEATHSIG fires when the *thread* that started the server exits: construct and
// start() it on a thread that outlives the server (the test's main thread). Fault helpers stop,
// resume, kill and restart it. Throws std::runtime_error (no Catch dependency: the fleet
// supervisor uses it too).
#include <sys/types.h>

#include <filesystem>
#include <string>
#include <vector>

#include "kiln/cache/redis_client.h"

namespace kiln::testing {

class RedisServer {
 public:
  // $KILN_REDIS_SERVER, else redis-server from PATH; empty when there is none.
  static std::string binary();

  // `extra`: more redis-server arguments (e.g. ACL users). `admin_password`: the default user's
  // password when `extra` sets one, for command().
  explicit RedisServer(std::vector<std::string> extra = {}, std::string admin_password = "");
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string url() const;           // redis://127.0.0.1:<port>
  RedisEndpoint endpoint() const;    // without credentials

  void kill();    // SIGKILL and reap: the port then refuses connections
  void stop();    // SIGSTOP: the kernel still accepts connections, nothing answers
  void resume();  // SIGCONT
  void start();   // start again on the same port, empty (after kill())

  // One command on a fresh connection (1 s timeouts), as the admin. Throws on a transport error.
  RedisReply command(const std::vector<std::string>& args) const;

 private:
  bool try_start();

  std::vector<std::string> extra_;
  std::string admin_password_;
  std::filesystem::path dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace kiln::testing
