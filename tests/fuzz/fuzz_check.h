// How a fuzz target reports a broken invariant: its name and what broke on stderr, then a trap,
// so libFuzzer keeps the input as a crash. A target defines `constexpr char kTarget[]` (its
// name) before using CHECK_INVARIANT.
#pragma once

#include <cstdio>

namespace wb::fuzz {

[[noreturn]] inline void Fail(const char* target, const char* what) {
  std::fprintf(stderr, "%s invariant violated: %s\n", target, what);
  __builtin_trap();
}

}  // namespace wb::fuzz

#define CHECK_INVARIANT(cond)                      \
  do {                                             \
    if (!(cond)) ::wb::fuzz::Fail(kTarget, #cond); \
  } while (0)
