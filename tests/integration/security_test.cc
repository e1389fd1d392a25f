// Control-plane and data-plane security with real processes. A test CA (and a rogue one) made
// by openssl in a temp dir; a controller and agents in mutual TLS + token mode run steps that
// commit verified bytes; wbctl without a token or certificate is refused in one line; an agent
// whose certificate comes from another CA cannot register; a valid agent certificate cannot
// drive Agent.LoadPlan; handshakes from agents the controller did not introduce, or under
// another agent's name, are refused. Token-only mode and startup errors are checked too.
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <set>

#include "client/weightbeam/controller_client.h"
#include "client/weightbeam/local_session.h"
#include "client/weightbeam/shared_buffer.h"
#include "common/grpc/credentials.h"
#include "tests/support/cluster.h"
#include "tests/support/one_tensor.h"
#include "tests/support/test_pki.h"
#include "weightbeam/v1/agent.grpc.pb.h"
#include "weightbeam/v1/transport.pb.h"

namespace v1 = weightbeam::v1;
using namespace wb::client;
using namespace wb::testing;  // the Cluster harness, test PKI, wbctl runner

namespace {

size_t Lines(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

// Agents may be up before the controller listens; calls made before then fail fast.
void WaitForController(const Cluster& cluster) {
  const std::string address = cluster.controller_address();
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  REQUIRE(wb::testing::WaitUntil([&] { return wb::testing::PortAccepts(port); },
                                 std::chrono::seconds(15)));
}

// A client of the cluster's plain controller (no TLS, no token, whatever the environment says),
// once it listens.
ControllerClient PlainController(const Cluster& cluster) {
  WaitForController(cluster);
  auto ctl = ControllerClient::Connect(cluster.controller_address(), ControllerClient::Security{});
  REQUIRE(ctl.ok());
  return std::move(*ctl);
}

// One BF16 tensor on each side, registered through the agents' Unix sockets (no TLS there).
using Sides = wb::testing::OneTensorSides;

// One process's lm_head.weight (64 x 256 bf16) on `agent` as rank 0 of `role`, its buffer
// filled with `fill`; the registration goes when the Side does.
struct Side {
  SharedBuffer buffer;
  LocalSession session;
  static Side Register(const Cluster& cluster, const std::string& agent, v1::Role role,
                       uint8_t fill) {
    auto buffer = SharedBuffer::Create(64 * 256 * 2, agent);
    REQUIRE(buffer.ok());
    std::memset(buffer->data(), fill, buffer->size());
    auto session = LocalSession::Connect(cluster.socket(agent), {role, 0, 0});
    REQUIRE(session.ok());
    REQUIRE(session
                ->Register({"lm_head.weight", v1::DTYPE_BF16, {64, 256}, {}}, *buffer, 0,
                           buffer->size())
                .ok());
    return Side{std::move(*buffer), std::move(*session)};
  }
  bool SameAs(const Side& other) const {
    return std::memcmp(buffer.data(), other.buffer.data(), buffer.size()) == 0;
  }
};

// Plans and steps version 1 between `fixed` and the side `open_first` registers; that side's
// process then leaves (its regions are withdrawn, the layout changes) and `open_second`'s takes
// its place: version 2 must re-plan and commit. Both steps' bytes are checked.
void ReplaceAfterFirstStep(ControllerClient* ctl, const Side& fixed,
                           const std::function<Side()>& open_first,
                           const std::function<Side()>& open_second) {
  {
    Side first = open_first();
    PlanOneToOne(ctl);
    RequireCommitted(ctl->Step(1));
    CHECK(first.SameAs(fixed));
  }
  Side second = open_second();
  REQUIRE(wb::testing::WaitUntil([&] { return ctl->Step(2).ok(); }, std::chrono::seconds(15)));
  CHECK(second.SameAs(fixed));
}

void PlanAndStep(ControllerClient* ctl, Sides* sides, uint64_t version) {
  if (version == 1) wb::testing::PlanOneToOne(ctl);
  sides->Fill(static_cast<uint8_t>(0x30 + version));
  RequireCommitted(ctl->Step(version));
  CHECK(sides->Same());
}

// An Agent stub as some certificate holder (`cert` empty: no certificate) with or without the
// token, for calls the test makes by hand.
std::unique_ptr<v1::Agent::Stub> AgentStub(const std::string& pki, const std::string& endpoint,
                                           const std::string& cert, bool token, bool tls = true) {
  wb::grpcutil::TlsConfig c;
  c.enabled = tls;
  c.ca_file = tls ? pki + "/ca.pem" : "";
  if (!cert.empty()) {
    c.cert_file = pki + "/" + cert + ".pem";
    c.key_file = pki + "/" + cert + ".key";
  }
  if (token) c.token_file = pki + "/token";
  auto f = wb::grpcutil::ChannelFactory::FromConfig(c);
  REQUIRE(f.ok());
  return v1::Agent::NewStub(f->Create(endpoint));
}

grpc::Status Handshake(v1::Agent::Stub* stub, const std::string& from_agent) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::HandshakeRequest req;
  req.set_from_agent(from_agent);
  req.set_transport("tcp");
  v1::TcpHello hello;
  hello.set_from_agent(from_agent);
  hello.set_endpoint("127.0.0.1:1");
  req.set_record(hello.SerializeAsString());
  v1::HandshakeResponse resp;
  return stub->Handshake(&ctx, req, &resp);
}

}  // namespace

TEST_CASE("mutual TLS + token: steps commit; outsiders, rogue certificates and strangers fail") {
  const std::string pki = wb::testing::MakeTestPki(
      {"wb-controller", "trainer-node", "inference-node", "intruder-node", "operator"},
      {"rogue-node"});
  REQUIRE(!pki.empty());
  ClusterOptions options;
  options.agents = {"trainer-node", "inference-node", "rogue-node", "impostor-node"};
  options.extra_controller_yaml = ControllerTlsYaml(pki);
  options.agent_yaml["trainer-node"] = AgentTlsYaml(pki, "trainer-node");
  options.agent_yaml["inference-node"] = AgentTlsYaml(pki, "inference-node");
  // Trusts our CA (so it could verify the controller) but holds a rogue CA's certificate.
  options.agent_yaml["rogue-node"] = AgentTlsYaml(pki, "rogue-node");
  // A valid certificate, but for another name than the one it registers under.
  options.agent_yaml["impostor-node"] = AgentTlsYaml(pki, "intruder-node");
  Cluster cluster(wb::testing::Runfile(""), options);
  WaitForController(cluster);
  Sides sides = Sides::Open(cluster);

  ControllerClient::Security operator_creds{pki + "/ca.pem", pki + "/operator.pem",
                                            pki + "/operator.key", pki + "/token", ""};
  auto ctl = ControllerClient::Connect(cluster.controller_address(), operator_creds);
  REQUIRE(ctl.ok());
  PlanAndStep(&*ctl, &sides, 1);
  CHECK_THAT(cluster.Log("controller"), Catch::Contains("mutual TLS, call token required"));

  // The rogue agent's certificate is not from our CA: it never registers.
  CHECK(wb::testing::WaitUntil(
      [&] {
        return cluster.Log("rogue-node").find("cannot register with controller") !=
               std::string::npos;
      },
      std::chrono::seconds(15)));
  CHECK(wb::testing::WaitUntil(
      [&] {
        return cluster.Log("impostor-node")
                   .find(
                       "Controller.RegisterAgent on wb-controller is for 'impostor-node' only; "
                       "the caller's certificate names 'intruder-node'") != std::string::npos;
      },
      std::chrono::seconds(15)));
  auto status = ctl->Status();
  REQUIRE(status.ok());
  std::set<std::string> names;
  for (const auto& a : status->agents()) names.insert(a.info().name());
  CHECK(names == std::set<std::string>{"inference-node", "trainer-node"});

  const std::string ctl_flag = "--controller=" + cluster.controller_address();
  // wbctl with nothing: the TLS handshake fails; one line names the controller and the fix.
  Output plain = Wbctl(cluster.dir(), {ctl_flag, "status"});
  INFO(plain.text);
  CHECK(plain.code == 2);
  CHECK(Lines(plain.text) == 1);
  CHECK_THAT(plain.text, Catch::StartsWith("wbctl: controller at " + cluster.controller_address() +
                                           " is unreachable") &&
                             Catch::Contains("--ca"));
  // A certificate but no token.
  const std::vector<std::string> cert_flags = {"--ca=" + pki + "/ca.pem",
                                               "--cert=" + pki + "/operator.pem",
                                               "--key=" + pki + "/operator.key"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {ctl_flag};
    args.insert(args.end(), cert_flags.begin(), cert_flags.end());
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back("status");
    return Wbctl(cluster.dir(), args);
  };
  Output no_token = with({});
  INFO(no_token.text);
  CHECK(no_token.code == 2);
  CHECK(Lines(no_token.text) == 1);
  CHECK_THAT(no_token.text, Catch::Contains("wb-controller requires a token"));
  Output wrong = with({"--token-file=" + pki + "/wrong-token"});
  INFO(wrong.text);
  CHECK(wrong.code == 2);
  CHECK_THAT(wrong.text, Catch::Contains("the token sent to wb-controller is wrong"));
  CHECK_THAT(wrong.text, !Catch::Contains("not-the-token") && !Catch::Contains(kTestToken));
  Output good = with({"--token-file=" + pki + "/token"});
  INFO(good.text);
  CHECK(good.code == 0);
  // The controller's certificate names wb-controller (and 127.0.0.1); another name fails.
  Output named = with({"--token-file=" + pki + "/token", "--server-name=wb-controller"});
  INFO(named.text);
  CHECK(named.code == 0);
  Output misnamed = with({"--token-file=" + pki + "/token", "--server-name=someone-else"});
  INFO(misnamed.text);
  CHECK(misnamed.code == 2);
  CHECK_THAT(misnamed.text, Catch::Contains("is unreachable"));

  const std::string inference = cluster.agent_address("inference-node");
  {
    INFO("an agent's valid certificate cannot drive the controller's Agent calls");
    auto stub = AgentStub(pki, inference, "trainer-node", true);
    grpc::ClientContext ctx;
    v1::LoadPlanRequest req;
    req.mutable_plan()->set_plan_id(999);
    v1::LoadPlanResponse resp;
    grpc::Status s = stub->LoadPlan(&ctx, req, &resp);
    CHECK(s.error_code() == grpc::StatusCode::PERMISSION_DENIED);
    CHECK_THAT(s.error_message(),
               Catch::Contains("Agent.LoadPlan on agent inference-node is only for the "
                               "controller ('wb-controller')") &&
                   Catch::Contains("'trainer-node'"));
    grpc::ClientContext cctx;
    v1::CommitRequest commit;
    commit.set_version(100);
    v1::CommitResponse cresp;
    CHECK(stub->Commit(&cctx, commit, &cresp).error_code() == grpc::StatusCode::PERMISSION_DENIED);
  }

  {
    INFO("the Agent service wants the token too");
    auto stub = AgentStub(pki, inference, "trainer-node", false);
    grpc::ClientContext ctx;
    v1::HealthResponse resp;
    grpc::Status s = stub->Health(&ctx, v1::HealthRequest(), &resp);
    CHECK(s.error_code() == grpc::StatusCode::UNAUTHENTICATED);
    CHECK_THAT(s.error_message(), Catch::Contains("agent inference-node requires a token"));
  }

  {
    INFO("handshakes: only introduced senders, only under their certificate's name");
    auto intruder = AgentStub(pki, inference, "intruder-node", true);
    grpc::Status s = Handshake(intruder.get(), "intruder-node");
    CHECK(s.error_code() == grpc::StatusCode::PERMISSION_DENIED);
    CHECK_THAT(s.error_message(),
               Catch::Contains("agent 'intruder-node' was not introduced by the controller"));
    // Claiming to be the introduced sender does not help without its certificate.
    s = Handshake(intruder.get(), "trainer-node");
    CHECK(s.error_code() == grpc::StatusCode::PERMISSION_DENIED);
    CHECK_THAT(s.error_message(), Catch::Contains("Agent.Handshake on agent inference-node is for "
                                                  "'trainer-node' only") &&
                                      Catch::Contains("'intruder-node'"));
  }

  // Whatever was refused above, the real path still works.
  PlanAndStep(&*ctl, &sides, 2);
}

TEST_CASE("token without TLS: steps commit; calls without it are refused; strangers too") {
  const std::string pki = wb::testing::MakeTestPki({});
  REQUIRE(!pki.empty());
  ClusterOptions options;
  options.extra_controller_yaml = "tls:\n  token_file: " + pki + "/token\n";
  options.extra_agent_yaml = "tls:\n  token_file: " + pki + "/token\n";
  Cluster cluster(wb::testing::Runfile(""), options);
  WaitForController(cluster);
  Sides sides = Sides::Open(cluster);
  auto ctl = ControllerClient::Connect(cluster.controller_address(),
                                       ControllerClient::Security{"", "", "", pki + "/token", ""});
  REQUIRE(ctl.ok());
  PlanAndStep(&*ctl, &sides, 1);
  CHECK_THAT(cluster.Log("controller"), Catch::Contains("control plane is insecure (no TLS)"));

  Output none = Wbctl(cluster.dir(), {"--controller=" + cluster.controller_address(), "plan"});
  INFO(none.text);
  CHECK(none.code == 2);
  CHECK(Lines(none.text) == 1);
  CHECK_THAT(none.text, Catch::Contains("wb-controller requires a token"));

  auto stranger = AgentStub(pki, cluster.agent_address("inference-node"), "", true, /*tls=*/false);
  grpc::Status s = Handshake(stranger.get(), "intruder-node");
  CHECK(s.error_code() == grpc::StatusCode::PERMISSION_DENIED);
  CHECK_THAT(s.error_message(),
             Catch::Contains("agent 'intruder-node' was not introduced by the controller"));
  auto no_token = AgentStub(pki, cluster.agent_address("inference-node"), "", false, /*tls=*/false);
  grpc::ClientContext ctx;
  v1::BeginRequest begin;
  begin.set_version(50);
  v1::BeginResponse resp;
  s = no_token->Begin(&ctx, begin, &resp);
  CHECK(s.error_code() == grpc::StatusCode::UNAUTHENTICATED);
  {
    // The step stream is admitted like the unary calls: without the token it ends at once, and
    // the begin sent on it never runs.
    grpc::ClientContext stream_ctx;
    stream_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto stream = no_token->StepStream(&stream_ctx);
    v1::StepCommand command;
    command.set_seq(1);
    *command.mutable_begin() = begin;
    stream->Write(command);
    v1::StepReply reply;
    CHECK_FALSE(stream->Read(&reply));
    s = stream->Finish();
    CHECK(s.error_code() == grpc::StatusCode::UNAUTHENTICATED);
  }
  PlanAndStep(&*ctl, &sides, 2);
}

TEST_CASE("unreadable TLS files and tokens stop a daemon at startup, naming key and file") {
  const std::string dir = wb::testing::TempDir("wb-tls-bad-");
  std::ofstream(dir + "/empty-token") << "  \n";
  std::ofstream(dir + "/c1.yaml") << "listen: 127.0.0.1:" << wb::testing::FreePort()
                                  << "\ntls:\n  enabled: true\n  cert_file: " << dir
                                  << "/missing.pem\n  key_file: " << dir << "/missing.key\n";
  std::ofstream(dir + "/c2.yaml") << "listen: 127.0.0.1:" << wb::testing::FreePort()
                                  << "\ntls:\n  token_file: " << dir << "/empty-token\n";
  const std::string bin = wb::testing::Runfile("controller/wb-controller");
  {
    Process p({bin, "--config", dir + "/c1.yaml"}, dir + "/c1.log");
    CHECK(p.Wait(std::chrono::seconds(20)) == 2);
  }
  CHECK_THAT(wb::testing::ReadFile(dir + "/c1.log"),
             Catch::Contains("tls.cert_file: cannot read " + dir + "/missing.pem"));
  {
    Process p({bin, "--config", dir + "/c2.yaml"}, dir + "/c2.log");
    CHECK(p.Wait(std::chrono::seconds(20)) == 2);
  }
  CHECK_THAT(wb::testing::ReadFile(dir + "/c2.log"),
             Catch::Contains("tls.token_file: " + dir + "/empty-token is empty"));

  // TLS without a CA or a token starts, and says that callers are not checked.
  const std::string pki = wb::testing::MakeTestPki({"wb-controller"});
  REQUIRE(!pki.empty());
  std::ofstream(dir + "/c3.yaml") << "listen: 127.0.0.1:" << wb::testing::FreePort()
                                  << "\ntls:\n  enabled: true\n  cert_file: " << pki
                                  << "/wb-controller.pem\n  key_file: " << pki
                                  << "/wb-controller.key\n";
  Process p({bin, "--config", dir + "/c3.yaml"}, dir + "/c3.log");
  CHECK(wb::testing::WaitUntil(
      [&] {
        return wb::testing::ReadFile(dir + "/c3.log")
                   .find("TLS is on but callers are not checked") != std::string::npos;
      },
      std::chrono::seconds(15)));
  CHECK_THAT(wb::testing::ReadFile(dir + "/c3.log"),
             Catch::Contains("(epoch") && Catch::Contains("; TLS)"));
}

TEST_CASE("the Unix socket gets the configured owner, group and mode; an unknown owner is named") {
  if (geteuid() != 0) {
    WARN("SKIPPED: changing a socket's owner needs root");
    return;
  }
  const std::string dir = wb::testing::TempDir("wb-sock-");
  const std::string agent = wb::testing::Runfile("daemon/wb-agent");
  auto write_config = [&](const std::string& file, const std::string& owner) {
    std::ofstream(dir + "/" + file)
        << "name: sock-node\nlocal_socket: " << dir
        << "/agent.sock\nsocket_mode: 0600\nsocket_owner: " << owner
        << "\nsocket_group: nogroup\nlisten: 127.0.0.1:" << wb::testing::FreePort()
        << "\ncontroller: 127.0.0.1:" << wb::testing::FreePort()
        << "\ntransports:\n  tcp:\n    listen: 127.0.0.1:0\n";
  };
  write_config("good.yaml", "nobody");
  {
    Process p({agent, "--config", dir + "/good.yaml"}, dir + "/good.log");
    const std::string sock = dir + "/agent.sock";
    struct stat st {};
    REQUIRE(wb::testing::WaitUntil(
        [&] {
          return stat(sock.c_str(), &st) == 0 && st.st_uid == getpwnam("nobody")->pw_uid &&
                 st.st_gid == getgrnam("nogroup")->gr_gid;
        },
        std::chrono::seconds(10)));
    CHECK((st.st_mode & 0777) == 0600);
  }
  write_config("bad.yaml", "no-such-user-wb");
  Process p({agent, "--config", dir + "/bad.yaml"}, dir + "/bad.log");
  CHECK(p.Wait(std::chrono::seconds(20)) == 1);
  CHECK_THAT(wb::testing::ReadFile(dir + "/bad.log"),
             Catch::Contains("socket_owner 'no-such-user-wb' does not exist"));
}

TEST_CASE("a side dropped from the plan is disconnected by its peer") {
  // A sender dropped: its receiver disconnects it and refuses its handshakes after. A receiver
  // dropped: its sender closes the connections to it.
  struct SideSpec {
    const char* agent;
    v1::Role role;
    uint8_t fill;
  };
  struct Case {
    const char* what;
    SideSpec fixed, first, second;
    const char* log_words;  // in the fixed side's log: what happened to `first`
  };
  const Case cases[] = {
      {"sender dropped",
       {"inference-node", v1::ROLE_INFERENCE, 0},
       {"trainer-a", v1::ROLE_TRAINER, 0xa1},
       {"trainer-b", v1::ROLE_TRAINER, 0xb2},
       "1 sender(s) introduced, 1 disconnected"},
      {"receiver dropped",
       {"trainer-node", v1::ROLE_TRAINER, 0x5c},
       {"inference-a", v1::ROLE_INFERENCE, 0},
       {"inference-b", v1::ROLE_INFERENCE, 0},
       "closed the connections to 1 peer(s) no longer in the plan: inference-a"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    ClusterOptions options;
    options.agents = {c.fixed.agent, c.first.agent, c.second.agent};
    Cluster cluster(wb::testing::Runfile(""), options);
    auto open = [&](const SideSpec& side) {
      return Side::Register(cluster, side.agent, side.role, side.fill);
    };
    Side fixed = open(c.fixed);
    ControllerClient ctl = PlainController(cluster);
    // Plan 1 with `first`; then its process leaves and `second` takes its place.
    ReplaceAfterFirstStep(
        &ctl, fixed, [&] { return open(c.first); }, [&] { return open(c.second); });
    CHECK_THAT(cluster.Log(c.fixed.agent), Catch::Contains(c.log_words));
    if (c.first.role == v1::ROLE_TRAINER) {
      auto stub = AgentStub("", cluster.agent_address(c.fixed.agent), "", false, /*tls=*/false);
      grpc::Status s = Handshake(stub.get(), c.first.agent);
      CHECK(s.error_code() == grpc::StatusCode::PERMISSION_DENIED);
      CHECK_THAT(s.error_message(), Catch::Contains(std::string("agent '") + c.first.agent +
                                                    "' was not introduced by the controller"));
    }
  }
}
