// store_worker: one process of the multi-process CubinStore tests (tests/unit/test_cubin_store.cpp).
//
//   store_worker --root DIR --key HEX [--ro DIR]... [--build-ms N] [--builds-file F] [--out F]
//                [--wait-fd N]
//
// Waits until fd N reads EOF (the test's start barrier), then calls get_or_build on KEY. The build
// sleeps N ms, appends "<pid>\n" to the builds file and returns a deterministic entry. Writes the
// encoded entry it got to --out and prints "built=<0|1> tier=<tier>" to stdout.
// KILN_TEST_CRASH_POINT=<point> raises SIGKILL at that publish fault point (see CubinStore::Options).
// Exit status: 0 on success, 1 on a kiln::Error (message on stderr), 2 on bad arguments.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "kiln/cache/cubin_store.h"
#include "kiln/jit/error.h"

namespace {

int usage(const char* why) {
  std::fprintf(stderr, "store_worker: %s\n", why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  kiln::CubinStore::Options options;
  std::string key_hex, builds_file, out_file;
  int build_ms = 0;
  int wait_fd = -1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) return usage(("missing value after " + arg).c_str());
    const char* value = argv[++i];
    if (arg == "--root") options.root = value;
    else if (arg == "--ro") options.read_only_layers.emplace_back(value);
    else if (arg == "--key") key_hex = value;
    else if (arg == "--build-ms") build_ms = std::atoi(value);
    else if (arg == "--builds-file") builds_file = value;
    else if (arg == "--out") out_file = value;
    else if (arg == "--wait-fd") wait_fd = std::atoi(value);
    else return usage(("unknown argument " + arg).c_str());
  }
  const auto key = kiln::CacheKey::parse_hex(key_hex);
  if (!key) return usage("--key needs 32 hex digits");

  // The crash point is read here, not in the library: the store only exposes the hook.
  if (const char* crash = std::getenv("KILN_TEST_CRASH_POINT")) {
    const std::string point = crash;
    options.fault_hook = [point](std::string_view at) {
      if (at == point) std::raise(SIGKILL);
    };
  }

  if (wait_fd >= 0) {
    // Every worker blocks here until the test closes the pipe's write end: one shared start.
    char c;
    for (;;) {
      const ssize_t n = ::read(wait_fd, &c, 1);
      if (n == 0 || (n < 0 && errno != EINTR)) break;
    }
    ::close(wait_fd);
  }

  try {
    kiln::CubinStore store(options);
    bool built = false;
    auto hit = store.get_or_build(
        *key,
        [&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(build_ms));
          if (!builds_file.empty()) {
            const int fd = ::open(builds_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
            const std::string line = std::to_string(::getpid()) + "\n";
            if (fd < 0 || ::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
              throw kiln::Error(kiln::ErrorCode::kInternal, "store_worker cannot append to the builds file",
                                kiln::ErrorDetails{"", builds_file, ""});
            }
            ::close(fd);
          }
          kiln::CacheEntry entry;
          entry.key = *key;
          entry.semantic_key = "test.worker/sm_90a/" + key_hex.substr(0, 8);
          entry.metadata = {{"builder_pid", ::getpid()}, {"arch", "sm_90a"}};
          for (int i = 0; i < 4096; ++i) entry.cubin.push_back(static_cast<char>((i * 31 + key_hex[i % 32]) & 0xff));
          return entry;
        },
        &built);
    if (!out_file.empty()) {
      std::ofstream out(out_file, std::ios::binary | std::ios::trunc);
      out << kiln::encode_entry(hit.entry);
      if (!out) throw kiln::Error(kiln::ErrorCode::kInternal, "store_worker cannot write --out", {"", out_file, ""});
    }
    std::printf("built=%d tier=%s\n", built ? 1 : 0, std::string(kiln::tier_name(hit.tier)).c_str());
    return 0;
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "store_worker: %s\n", e.what());
    return 1;
  }
}
