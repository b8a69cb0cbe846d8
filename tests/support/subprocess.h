#pragma once
// Real child processes for tests: fork + execve with a given argv and environment, stdout and
// stderr going to files (no pipe can fill up and block the child, and many can run at once).
#include <sys/types.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace kiln::testing {

using Environment = std::map<std::string, std::string>;

// This process's environment, name -> value.
Environment current_environment();

struct SpawnOptions {
  std::vector<std::string> argv;        // argv[0]: the executable's path
  Environment env;                      // the child's whole environment
  std::filesystem::path stdout_file;    // created or truncated
  std::filesystem::path stderr_file;    // the same path as stdout_file: one file gets both
  std::filesystem::path cwd;            // the child's working directory; empty: this process's
};

struct ProcessResult {
  int exit_code = -1;    // the exit status, or 128 + the signal when killed (as a shell reports it)
  int term_signal = 0;   // the signal, when killed by one
  int wait_status = 0;   // what waitpid reported
  std::string out;       // the stdout file's contents
  std::string err;       // the stderr file's contents
};

// A started child. Everything it needs is prepared before fork(); after it, only async-signal-safe
// calls (chdir, open, dup2, execve, _exit: 126 when a file or the cwd fails, 127 when exec fails).
// Descriptors without FD_CLOEXEC stay open in the child.
class Subprocess {
 public:
  explicit Subprocess(SpawnOptions options);  // REQUIREs that fork succeeded
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  pid_t pid() const { return pid_; }
  // Waits for the child (retrying EINTR) and reads its output files.
  ProcessResult wait();

 private:
  SpawnOptions options_;
  pid_t pid_ = -1;
};

// The `kiln` CLI: $KILN_CLI, else the build's own (compile definition KILN_CLI_PATH), else ../kiln
// next to this test binary's directory.
std::filesystem::path kiln_cli_path();

// This process's environment without any KILN_ setting (a developer's cache layers, sealing, remote
// tier...), with KILN_CACHE_DIR under `scratch` (so no user cache is touched) and warnings logged.
Environment kiln_cli_environment(const std::filesystem::path& scratch);

// The `kiln` CLI with `args` in `env`, its stdout and stderr in `scratch`/`tag`.stdout and .stderr.
SpawnOptions kiln_cli(const std::vector<std::string>& args, Environment env, const std::filesystem::path& scratch,
                      const std::string& tag = "cli");

}  // namespace kiln::testing
