// A SIGBUS guard for CPU copies of registered memory: a process that shrinks (ftruncate) its
// shared-memory object after registering turns the agent's next access past the new end into
// SIGBUS. Inside RunBusGuarded that signal ends the copy with an error instead of the agent.
#pragma once

#include <functional>

namespace wb::registry {

// Runs `copy` on this thread; returns false when a SIGBUS interrupted it (part of the
// destination may be written). `copy` must hold no lock and own no heap memory: it is left by
// siglongjmp. Costs a sigsetjmp without a signal-mask save (no syscall) per call. A SIGBUS
// outside a guard keeps its default action.
bool RunBusGuarded(const std::function<void()>& copy);

// True while this thread runs inside RunBusGuarded. Code that must never be left by siglongjmp
// (a CUDA driver call: it would leave the driver's locks held) checks it in tests.
bool InsideBusGuard();

}  // namespace wb::registry
