#include "tests/support/test_pki.h"

#include <cstdlib>
#include <fstream>

#include "tests/support/process.h"

namespace wb::testing {

const char kTestToken[] = "s3cret-test-token-7f1c";

std::string MakeTestPki(const std::vector<std::string>& names,
                        const std::vector<std::string>& rogue_names) {
  const std::string dir = TempDir("wb-pki-");
  std::string leaves, rogues;
  for (const auto& n : names) leaves += " " + n;
  for (const auto& n : rogue_names) rogues += " " + n;
  std::ofstream(dir + "/make.sh") << R"(set -e
cd ")" << dir << R"("
ca() { openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout $1.key -out $1.pem -days 2 -subj /CN=$1 >/dev/null 2>&1; }
leaf() { openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout $1.key -out $1.csr -subj /CN=$1 >/dev/null 2>&1
  printf 'subjectAltName=DNS:%s,IP:127.0.0.1\n' $1 > $1.ext
  openssl x509 -req -in $1.csr -CA $2.pem -CAkey $2.key -CAcreateserial -out $1.pem -days 2 \
    -extfile $1.ext >/dev/null 2>&1; }
ca ca; ca rogue-ca
for n in)" << leaves << R"(; do leaf $n ca; done
for n in)" << rogues << R"(; do leaf $n rogue-ca; done
printf '  )" << kTestToken << R"(\n' > token
printf 'not-the-token\n' > wrong-token
)";
  if (std::system(("bash " + dir + "/make.sh").c_str()) != 0) return "";
  return dir;
}

std::string ControllerTlsYaml(const std::string& pki) {
  return "tls:\n  enabled: true\n  cert_file: " + pki + "/wb-controller.pem\n  key_file: " + pki +
         "/wb-controller.key\n  ca_file: " + pki +
         "/ca.pem\n  require_client_cert: true\n  token_file: " + pki + "/token\n";
}

std::string AgentTlsYaml(const std::string& pki, const std::string& name) {
  return "tls:\n  enabled: true\n  cert_file: " + pki + "/" + name + ".pem\n  key_file: " + pki +
         "/" + name + ".key\n  ca_file: " + pki +
         "/ca.pem\n  require_client_cert: true\n  token_file: " + pki +
         "/token\n  controller_identity: wb-controller\n";
}

}  // namespace wb::testing
