// What every benchmark JSON line says about the machine it ran on, so figures from different
// runs (a quiet machine, one shared with other builds) can be read side by side: the cores this
// process may use and the load averages at the time of the measurement.
#pragma once

#include <sched.h>
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace wb::bench {

// Adds "cores" and "loadavg" ([1, 5, 15] minutes, from /proc/loadavg) to `out`.
inline void AddMachineInfo(nlohmann::json* out) {
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

// The same fields as JSON members without braces (`"cores":2,"loadavg":[0.5,0.4,0.3]`), for
// the benchmarks that print their lines with printf.
inline std::string MachineInfoFields() {
  nlohmann::json j;
  AddMachineInfo(&j);
  const std::string s = j.dump();
  return s.substr(1, s.size() - 2);
}

}  // namespace wb::bench
