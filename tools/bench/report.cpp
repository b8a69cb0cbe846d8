#include "tools/bench/report.h"

#include <unistd.h>

#include <array>
#include <cstdlib>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <thread>

#include "kiln/jit/compiler.h"
#include "kiln/jit/error.h"
#include "kiln/runtime/driver.h"

namespace kiln::tools {

namespace {
std::string command_output(const char* cmd) {
  std::string out;
  if (FILE* p = popen(cmd, "r")) {
    std::array<char, 256> buf{};
    while (fgets(buf.data(), buf.size(), p)) out += buf.data();
    pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}
}  // namespace

nlohmann::json bench_header(const std::string& what) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  const char* commit = std::getenv("KILN_COMMIT");
  const NvrtcVersion nvrtc = Compiler::nvrtc_version();
  nlohmann::json h = {{"bench", what},
                      {"date", date},
                      {"commit", commit ? std::string(commit) : command_output("git rev-parse --short HEAD 2>/dev/null")},
                      {"host", host},
                      {"cpu_threads", std::thread::hardware_concurrency()},
                      {"nvrtc", std::to_string(nvrtc.major) + "." + std::to_string(nvrtc.minor)}};
  // Compile and host-time figures scale with whatever else the machine runs: the 1, 5 and 15 minute
  // load averages when the bench starts say how loaded it was.
  double load[3] = {};
  if (getloadavg(load, 3) == 3) h["load_average"] = {load[0], load[1], load[2]};
  const Driver& d = Driver::get();
  if (d.available()) {
    int version = 0;
    d.cuDriverGetVersion(&version);
    char name[256] = {};
    CUdevice dev = 0;
    d.cuDeviceGet(&dev, 0);
    d.cuDeviceGetName(name, sizeof name, dev);
    h["gpu"] = name;
    h["cuda_driver_api"] = version;
    h["driver"] = command_output("nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1");
    h["power_state"] = command_output(
        "nvidia-smi --query-gpu=pstate,power.draw,power.limit,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader 2>/dev/null | head -1");
  } else {
    h["gpu"] = nullptr;
    h["gpu_unavailable_reason"] = d.reason();
  }
  return h;
}

void write_report(const nlohmann::json& report, const std::string& path) {
  std::printf("%s\n", report.dump(2).c_str());
  if (path.empty()) return;
  std::ofstream out(path);
  out << report.dump(2) << "\n";
  if (!out) throw Error(ErrorCode::kCacheIo, "cannot write the benchmark report", {.path = path});
}

}  // namespace kiln::tools
