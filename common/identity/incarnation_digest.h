// An agent's incarnation is a per-process secret that its controller calls carry. Its digest may
// be shown to anyone: the agent answers it on Health, so the controller can check that the
// process listening on a control endpoint is the one registering under that endpoint (a restart
// takes its old name at once only then; see controller/membership.h).
#pragma once

#include <string>

namespace wb::identity {

// SHA-256 of a domain string and the incarnation: 32 bytes.
std::string IncarnationDigest(const std::string& incarnation);

}  // namespace wb::identity
