// What every benchmark shares: how it gives up (Die) and what its JSON lines say about the
// machine they ran on, so figures from different runs (a quiet machine, one shared with other
// builds) can be read side by side: the cores this process may use and the load averages at the
// time of the measurement. Linking it sends spdlog's logs to stderr: stdout carries the JSON.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace wb::bench {

// Prints "<program>: <what>" on stderr, runs the hook set by OnDie (if any), exits 1.
[[noreturn]] void Die(const std::string& what);

// A hook Die runs before exiting (control_bench kills its controller); replaces any earlier one.
void OnDie(void (*hook)());

// Adds "cores" and "loadavg" ([1, 5, 15] minutes, from /proc/loadavg) to `out`.
void AddMachineInfo(nlohmann::json* out);

// The same fields as JSON members without braces (`"cores":2,"loadavg":[0.5,0.4,0.3]`), for
// the benchmarks that print their lines with printf.
std::string MachineInfoFields();

}  // namespace wb::bench
