#include "tests/bench/bench_support.h"

#include <errno.h>
#include <sched.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace wb::bench {
namespace {
void (*g_die_hook)() = nullptr;

// Every benchmark prints its JSON alone on stdout (scripts parse it: compare_tcp.sh); the logs
// of the code it runs (transports, agents) go to stderr, from before main.
const bool g_logs_on_stderr = [] {
  spdlog::set_default_logger(spdlog::stderr_color_mt("bench"));
  return true;
}();
}  // namespace

void Die(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", program_invocation_short_name, what.c_str());
  if (g_die_hook != nullptr) g_die_hook();
  std::exit(1);
}

void OnDie(void (*hook)()) { g_die_hook = hook; }

void AddMachineInfo(nlohmann::json* out) {
  cpu_set_t set;
  CPU_ZERO(&set);
  int cores = 0;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = CPU_COUNT(&set);
  if (cores <= 0) cores = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  (*out)["cores"] = cores;
  double load[3] = {-1, -1, -1};
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = -1;
    std::fclose(f);
  }
  (*out)["loadavg"] = {load[0], load[1], load[2]};
}

std::string MachineInfoFields() {
  nlohmann::json j;
  AddMachineInfo(&j);
  const std::string s = j.dump();
  return s.substr(1, s.size() - 2);
}

}  // namespace wb::bench
