// Start-up and shutdown manners shared by wb-agent and wb-controller: termination signals
// taken by one thread, systemd notifications, and the insecure-mode warning.
#pragma once

#include <signal.h>

namespace wb {

// Blocks SIGTERM and SIGINT in the calling thread (and so in every thread started after it)
// and ignores SIGPIPE. Create it first thing in main, before any thread starts.
class TerminationSignals {
 public:
  TerminationSignals();
  // Waits for SIGTERM or SIGINT; returns the signal number.
  int Wait();

 private:
  sigset_t set_;
};

// sd_notify wrappers; no-ops when not run by systemd.
void NotifyReady();
void NotifyStopping();

// Says at startup that the control plane runs without TLS.
void WarnIfInsecure(bool tls_enabled);
// Says at startup when TLS is on but callers are not checked (no CA to verify client
// certificates, no token): the channel is private, yet anyone who reaches the port may call.
void WarnIfCallersUnchecked(bool tls_enabled, bool has_ca, bool has_token);

}  // namespace wb
