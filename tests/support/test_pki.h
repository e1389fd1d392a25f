// Test support: a throw-away PKI made with the openssl CLI in a fresh temp dir (nothing secret
// is committed): a CA, a rogue CA, EC certificates whose CN and SAN DNS are the given names (SAN
// IP 127.0.0.1), a token file and a wrong one; plus the daemons' tls: YAML blocks using them.
#pragma once

#include <string>
#include <vector>

namespace wb::testing {

// The token in `<dir>/token` (the file pads it with white space, which readers trim).
extern const char kTestToken[];

// Certificates `<dir>/<name>.pem` + `.key` signed by `<dir>/ca.pem`, and for `rogue_names` by
// `<dir>/rogue-ca.pem`. Returns the directory, or "" when openssl failed.
std::string MakeTestPki(const std::vector<std::string>& names,
                        const std::vector<std::string>& rogue_names = {});

// The controller's tls: block: mutual TLS with `<pki>/wb-controller.pem` and the token.
std::string ControllerTlsYaml(const std::string& pki);
// An agent's tls: block with certificate `name`, expecting the controller as "wb-controller".
std::string AgentTlsYaml(const std::string& pki, const std::string& name);

}  // namespace wb::testing
