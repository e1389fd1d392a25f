#include "common/process/daemon_lifecycle.h"

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

void WarnIfCallersUnchecked(bool tls_enabled, bool has_ca, bool has_token) {
  if (tls_enabled && !has_ca && !has_token) {
    spdlog::warn(
        "TLS is on but callers are not checked (no tls.ca_file for client certificates, no "
        "tls.token_file): anyone who reaches the port may call");
  }
}

}  // namespace wb
