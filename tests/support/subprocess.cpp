#include "tests/support/subprocess.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "tests/support/files.h"

extern char** environ;

namespace kiln::testing {

namespace fs = std::filesystem;

Environment current_environment() {
  Environment env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string item(*e);
    const auto eq = item.find('=');
    if (eq != std::string::npos) env[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return env;
}

Subprocess::Subprocess(SpawnOptions options) : options_(std::move(options)) {
  REQUIRE_FALSE(options_.argv.empty());
  std::vector<std::string> env_storage;
  for (const auto& [k, v] : options_.env) env_storage.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_storage) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<char*> argv;
  for (auto& s : options_.argv) argv.push_back(s.data());
  argv.push_back(nullptr);
  const std::string out_file = options_.stdout_file.string();
  const std::string err_file = options_.stderr_file.string();
  const bool one_file = out_file == err_file;
  const std::string dir = options_.cwd.string();

  std::fflush(nullptr);  // nothing buffered here is written twice
  pid_ = ::fork();
  REQUIRE(pid_ >= 0);
  if (pid_ == 0) {
    if (!dir.empty() && ::chdir(dir.c_str()) != 0) ::_exit(126);
    const int out = ::open(out_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = one_file ? out : ::open(err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out < 0 || err < 0) ::_exit(126);
    ::dup2(out, 1);
    ::dup2(err, 2);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
}

ProcessResult Subprocess::wait() {
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0) REQUIRE(errno == EINTR);
  ProcessResult r;
  r.wait_status = status;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (WIFSIGNALED(status)) r.term_signal = WTERMSIG(status);
  const fs::path base = options_.cwd.empty() ? fs::path() : options_.cwd;
  r.out = read_text(base / options_.stdout_file);
  r.err = read_text(base / options_.stderr_file);
  return r;
}

fs::path kiln_cli_path() {
  if (const char* p = std::getenv("KILN_CLI"); p && *p) return p;
#ifdef KILN_CLI_PATH
  return KILN_CLI_PATH;
#else
  return fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "kiln";
#endif
}

Environment kiln_cli_environment(const fs::path& scratch) {
  Environment env = current_environment();
  std::erase_if(env, [](const auto& v) { return v.first.starts_with("KILN_"); });
  env["KILN_CACHE_DIR"] = (scratch / "env_cache").string();
  env["KILN_LOG_LEVEL"] = "warn";
  return env;
}

SpawnOptions kiln_cli(const std::vector<std::string>& args, Environment env, const fs::path& scratch, const std::string& tag) {
  std::vector<std::string> argv = {kiln_cli_path().string()};
  argv.insert(argv.end(), args.begin(), args.end());
  return SpawnOptions{.argv = std::move(argv),
                      .env = std::move(env),
                      .stdout_file = scratch / (tag + ".stdout"),
                      .stderr_file = scratch / (tag + ".stderr")};
}

}  // namespace kiln::testing
