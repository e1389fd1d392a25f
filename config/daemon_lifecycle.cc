#include "config/daemon_lifecycle.h"

#include <spdlog/spdlog.h>
#include <systemd/sd-daemon.h>

namespace wb {

TerminationSignals::TerminationSignals() {
  sigemptyset(&set_);
  sigaddset(&set_, SIGTERM);
  sigaddset(&set_, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set_, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

int TerminationSignals::Wait() {
  int sig = 0;
  sigwait(&set_, &sig);
  return sig;
}

void NotifyReady() { sd_notify(0, "READY=1"); }

void NotifyStopping() { sd_notify(0, "STOPPING=1"); }

void WarnIfInsecure(bool tls_enabled) {
  if (!tls_enabled) {
    spdlog::warn("control plane is insecure (no TLS): fine on one machine, not on a cluster");
  }
}

}  // namespace wb
