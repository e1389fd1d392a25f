#include "daemon/registry/bus_guard.h"

#include <setjmp.h>
#include <signal.h>

#include <mutex>

namespace wb::registry {
namespace {

thread_local sigjmp_buf* t_guard = nullptr;

void OnSigbus(int sig, siginfo_t*, void*) {
  if (sigjmp_buf* guard = t_guard) siglongjmp(*guard, 1);
  // Not inside a guard: die as SIGBUS would have killed us.
  signal(sig, SIG_DFL);
  raise(sig);
}

void Install() {
  struct sigaction sa {};
  sa.sa_sigaction = OnSigbus;
  // SA_NODEFER: leaving the handler by siglongjmp without a saved mask keeps SIGBUS unblocked.
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, nullptr);
}

}  // namespace

bool RunBusGuarded(const std::function<void()>& copy) {
  static std::once_flag installed;
  std::call_once(installed, Install);
  sigjmp_buf guard;
  sigjmp_buf* const outer = t_guard;
  if (sigsetjmp(guard, 0) != 0) {
    t_guard = outer;
    return false;
  }
  t_guard = &guard;
  copy();
  t_guard = outer;
  return true;
}

bool InsideBusGuard() { return t_guard != nullptr; }

}  // namespace wb::registry
