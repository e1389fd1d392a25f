// StepLinks, the controller's step commands on one sealed socket per agent, against real agents'
// step-link listeners (StepLinkServer) behind real gRPC servers in this process: a fan-out to
// agents without links sends nothing on links (not_sent, for the stream) and opens them in the
// background; answers then come back in order on one link kept across fan-outs; a stalled agent
// ends at the deadline and gets a new link later; an agent whose listener goes away fails its
// command with the link's end; agents that refuse links (older builds, links off) stay on the
// stream until Reset, and one whose port cannot be reached or whose handshake meets a long
// command is tried again after a backoff; an agent flooding replies does not hold a fan-out.
#include "controller/step_links.h"

#include <grpcpp/grpcpp.h>
#include <sys/socket.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/net/socket_util.h"
#include "common/steplink/link_cipher.h"
#include "daemon/service/step_link_server.h"
#include "weightbeam/v1/agent.grpc.pb.h"

namespace wb::controller {
namespace {

namespace v1 = weightbeam::v1;

// Grants links on a real StepLinkServer whose commands answer FAILED_PRECONDITION with this
// agent's name; the first `stall` commands get no answer. `refuse`: OpenStepLink fails with it.
// `port_override`: the grant names this port instead (nothing listens there).
class FakeLinkAgent final : public v1::Agent::CallbackService {
 public:
  FakeLinkAgent(std::string name, int stall, grpc::StatusCode refuse = grpc::StatusCode::OK,
                uint32_t port_override = 0)
      : name_(std::move(name)), stall_(stall), refuse_(refuse), port_override_(port_override) {
    service::StepLinkOptions o;
    o.host = "127.0.0.1";
    auto s = service::StepLinkServer::Start(o, [this](v1::StepCommand c, auto reply) {
      ++ran_;
      // A long command (an execute) holds the agent's one link thread, handshakes included.
      if (const int ms = block_first_ms_.exchange(0); ms > 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      }
      if (stall_-- > 0) {
        held_.push_back(std::move(reply));  // never answered (kept so nothing replies late)
        return;
      }
      v1::StepReply r;
      r.set_seq(c.seq());
      r.set_code(static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION));
      r.set_error(name_);
      reply(std::move(r));
    });
    REQUIRE(s.ok());
    links_ = std::move(*s);
  }

  grpc::ServerUnaryReactor* OpenStepLink(grpc::CallbackServerContext* ctx,
                                         const v1::OpenStepLinkRequest*,
                                         v1::OpenStepLinkResponse* resp) override {
    ++grants_;
    auto* r = ctx->DefaultReactor();
    if (refuse_ != grpc::StatusCode::OK) {
      r->Finish(grpc::Status(refuse_, "no links here"));
      return r;
    }
    auto g = links_->Issue();
    resp->set_port(port_override_ != 0 ? port_override_ : g->port);
    resp->set_link_id(g->link_id);
    resp->set_key(g->key);
    r->Finish(grpc::Status::OK);
    return r;
  }

  int grants() const { return grants_; }
  int ran() const { return ran_; }
  // The next command holds the link thread this long before it answers.
  void BlockNext(std::chrono::milliseconds ms) { block_first_ms_ = static_cast<int>(ms.count()); }
  service::StepLinkServer* links() { return links_.get(); }

 private:
  const std::string name_;
  std::atomic<int> stall_;
  const grpc::StatusCode refuse_;
  const uint32_t port_override_;
  std::atomic<int> grants_{0}, ran_{0}, block_first_ms_{0};
  std::vector<std::function<void(v1::StepReply)>> held_;
  std::unique_ptr<service::StepLinkServer> links_;
};

// A hostile agent: grants a link on a listener of its own, completes the handshake, then floods
// the controller with valid sealed replies nobody asked for (`frames` of them, sealed up front
// so that the flood is never slower than the controller's reading).
class FloodAgent final : public v1::Agent::CallbackService {
 public:
  explicit FloodAgent(size_t frames) {
    auto l = net::ListenTcp({"127.0.0.1", 0}, &port_);
    REQUIRE(l.ok());
    listener_ = std::move(*l);
    id_ = std::string(steplink::kLinkIdBytes, 'i');
    key_ = std::string(steplink::kKeyBytes, 'k');
    auto cipher = steplink::LinkCipher::Create(key_, steplink::Direction::kToController);
    REQUIRE(cipher.ok());
    cipher_.emplace(std::move(*cipher));
    REQUIRE(cipher_->Seal("", &flood_).ok());  // the acknowledgement
    v1::StepReply junk;
    junk.set_seq(0);
    const std::string plain = junk.SerializeAsString();
    flood_.reserve(flood_.size() + frames * (steplink::kLengthBytes + steplink::kTagBytes));
    bool sealed = true;
    for (size_t i = 0; i < frames; ++i) sealed = cipher_->Seal(plain, &flood_).ok() && sealed;
    REQUIRE(sealed);
    thread_ = std::thread([this] { Serve(); });
  }
  ~FloodAgent() override {
    stop_ = true;
    if (conn_ >= 0) ::shutdown(conn_, SHUT_RDWR);
    ::shutdown(listener_.get(), SHUT_RDWR);
    thread_.join();
    if (conn_ >= 0) ::close(conn_);
  }

  grpc::ServerUnaryReactor* OpenStepLink(grpc::CallbackServerContext* ctx,
                                         const v1::OpenStepLinkRequest*,
                                         v1::OpenStepLinkResponse* resp) override {
    resp->set_port(port_);
    resp->set_link_id(id_);
    resp->set_key(key_);
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
  // Whether the whole flood went out (the controller read all but what the buffers hold).
  bool flooded() const { return flooded_; }

 private:
  void Serve() {
    conn_ = ::accept(listener_.get(), nullptr, nullptr);
    if (conn_ < 0) return;
    std::string hello(steplink::kHelloBytes, '\0');
    size_t got = 0;
    int error = 0;
    if (net::RecvExact(conn_, hello.data(), hello.size(), &got, &error) != net::RecvOutcome::kOk ||
        hello.compare(0, steplink::kLinkIdBytes, id_) != 0 ||
        !cipher_->OpenEmptyFrame(std::string_view(hello).substr(steplink::kLinkIdBytes)).ok()) {
      return;
    }
    flooded_ = net::SendAll(conn_, flood_.data(), flood_.size()).ok() && !stop_;
  }

  uint16_t port_ = 0;
  net::UniqueFd listener_;
  std::string id_, key_, flood_;
  std::optional<steplink::LinkCipher> cipher_;
  std::atomic<int> conn_{-1};
  std::atomic<bool> stop_{false}, flooded_{false};
  std::thread thread_;
};

// An agent of an older build: no OpenStepLink.
class OldAgent final : public v1::Agent::Service {};

struct Running {
  std::unique_ptr<grpc::Service> service;
  std::unique_ptr<grpc::Server> server;
  std::string endpoint;
  FakeLinkAgent* agent() { return static_cast<FakeLinkAgent*>(service.get()); }
  ~Running() {
    if (server) server->Shutdown(std::chrono::system_clock::now());
  }
};

std::unique_ptr<Running> Serve(std::unique_ptr<grpc::Service> service) {
  auto r = std::make_unique<Running>();
  r->service = std::move(service);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(r->service.get());
  r->server = builder.BuildAndStart();
  REQUIRE(r->server);
  r->endpoint = "127.0.0.1:" + std::to_string(port);
  return r;
}

std::vector<v1::StepCommand> Commands(size_t n) {
  std::vector<v1::StepCommand> out(n);
  for (auto& c : out) c.mutable_begin()->set_version(7);
  return out;
}

bool WaitFor(const std::function<bool()>& ready) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (!ready()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// The first fan-out finds no links: every command comes back not_sent (the caller sends it on
// the stream) and links are opened in the background; returns once `n` are open.
void OpenLinks(StepLinks* links, const std::vector<std::string>& endpoints, size_t n) {
  auto commands = Commands(endpoints.size());
  const auto answers = links->Send(endpoints, &commands, std::chrono::seconds(10));
  REQUIRE(answers.size() == endpoints.size());
  for (const auto& a : answers) CHECK(a.not_sent);
  REQUIRE(WaitFor([&] { return links->open_links() == n; }));
}

TEST_CASE("answers come back in order, on one link per agent kept across fan-outs") {
  std::vector<std::unique_ptr<Running>> agents;
  std::vector<std::string> endpoints;
  for (int i = 0; i < 5; ++i) {
    agents.push_back(Serve(std::make_unique<FakeLinkAgent>("agent-" + std::to_string(i), 0)));
    endpoints.push_back(agents.back()->endpoint);
  }
  AgentChannels channels;
  StepLinks links(&channels);
  OpenLinks(&links, endpoints, 5);
  for (auto& a : agents) CHECK(a->agent()->ran() == 0);  // the first commands never left
  for (int round = 0; round < 3; ++round) {
    auto commands = Commands(endpoints.size());
    const auto answers = links.Send(endpoints, &commands, std::chrono::seconds(10));
    REQUIRE(answers.size() == endpoints.size());
    for (size_t i = 0; i < answers.size(); ++i) {
      INFO("round " << round << ", agent " << i);
      CHECK_FALSE(answers[i].not_sent);
      CHECK(answers[i].status.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
      CHECK(answers[i].status.error_message() == "agent-" + std::to_string(i));
      CHECK(answers[i].reply.seq() == commands[i].seq());
    }
  }
  CHECK(links.open_links() == 5);
  for (auto& a : agents) {
    CHECK(a->agent()->grants() == 1);
    CHECK(a->agent()->ran() == 3);
    CHECK(a->agent()->links()->open_links() == 1);
  }
}

TEST_CASE("the same agent twice in one fan-out gets both commands on its one link") {
  auto a = Serve(std::make_unique<FakeLinkAgent>("twice", 0));
  AgentChannels channels;
  StepLinks links(&channels);
  OpenLinks(&links, {a->endpoint, a->endpoint}, 1);
  auto commands = Commands(2);
  const auto answers = links.Send({a->endpoint, a->endpoint}, &commands, std::chrono::seconds(10));
  CHECK(answers[0].status.error_message() == "twice");
  CHECK(answers[1].status.error_message() == "twice");
  CHECK(answers[0].reply.seq() != answers[1].reply.seq());
  CHECK(a->agent()->grants() == 1);
}

TEST_CASE("a stalled agent ends at the deadline alone and gets a new link afterwards") {
  auto ok = Serve(std::make_unique<FakeLinkAgent>("ok", 0));
  auto stalled = Serve(std::make_unique<FakeLinkAgent>("stalled", 1));
  AgentChannels channels;
  StepLinks links(&channels);
  const std::vector<std::string> endpoints = {ok->endpoint, stalled->endpoint};
  OpenLinks(&links, endpoints, 2);
  auto commands = Commands(2);
  const auto t0 = std::chrono::steady_clock::now();
  auto answers = links.Send(endpoints, &commands, std::chrono::milliseconds(400));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3));
  CHECK(answers[0].status.error_message() == "ok");
  CHECK(answers[1].status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
  CHECK_FALSE(answers[1].not_sent);  // it was sent: the caller must not send it again
  // The stalled link was closed: the next fan-out has none for it (not_sent) and opens one.
  commands = Commands(2);
  answers = links.Send(endpoints, &commands, std::chrono::seconds(10));
  CHECK(answers[0].status.error_message() == "ok");
  CHECK(answers[1].not_sent);
  REQUIRE(WaitFor([&] { return links.Has(stalled->endpoint); }));
  commands = Commands(2);
  answers = links.Send(endpoints, &commands, std::chrono::seconds(10));
  CHECK(answers[0].status.error_message() == "ok");
  CHECK(answers[1].status.error_message() == "stalled");
  CHECK(stalled->agent()->grants() == 2);
  CHECK(ok->agent()->grants() == 1);
}

TEST_CASE("an agent whose listener goes away fails its command with the link's end") {
  auto going = Serve(std::make_unique<FakeLinkAgent>("going", 1));
  AgentChannels channels;
  StepLinks links(&channels);
  OpenLinks(&links, {going->endpoint}, 1);
  // The command gets no answer; the listener stops meanwhile.
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    going->agent()->links()->Stop();
  });
  auto commands = Commands(1);
  const auto answers = links.Send({going->endpoint}, &commands, std::chrono::seconds(20));
  stopper.join();
  REQUIRE(answers.size() == 1);
  CHECK_FALSE(answers[0].not_sent);
  CHECK(answers[0].status.error_code() == grpc::StatusCode::UNAVAILABLE);
  CHECK(answers[0].status.error_message().find("step link") != std::string::npos);
  CHECK(links.open_links() == 0);
}

TEST_CASE("agents without links come back not_sent and are remembered until Reset") {
  auto old = Serve(std::make_unique<OldAgent>());
  auto off =
      Serve(std::make_unique<FakeLinkAgent>("off", 0, grpc::StatusCode::FAILED_PRECONDITION));
  // A grant naming a port nothing listens on (a firewall would look the same, or worse).
  uint16_t dead_port = 0;
  {
    auto l = net::ListenTcp({"127.0.0.1", 0}, &dead_port);
    REQUIRE(l.ok());
  }  // closed: connecting there is refused
  auto unreachable =
      Serve(std::make_unique<FakeLinkAgent>("unreachable", 0, grpc::StatusCode::OK, dead_port));
  auto fine = Serve(std::make_unique<FakeLinkAgent>("fine", 0));
  AgentChannels channels;
  StepLinks links(&channels);
  const std::vector<std::string> endpoints = {old->endpoint, off->endpoint, unreachable->endpoint,
                                              fine->endpoint};
  OpenLinks(&links, endpoints, 1);
  REQUIRE(WaitFor([&] { return !links.Links(endpoints[0]) && !links.Links(endpoints[1]); }));
  // The unreachable port is not given up on: asked again, after a backoff.
  CHECK(links.Links(endpoints[2]));
  CHECK(links.Links(endpoints[3]));
  auto commands = Commands(4);
  auto answers = links.Send(endpoints, &commands, std::chrono::seconds(10));
  CHECK(answers[0].not_sent);
  CHECK(answers[1].not_sent);
  CHECK(answers[2].not_sent);
  CHECK_FALSE(answers[3].not_sent);
  CHECK(answers[3].status.error_message() == "fine");
  CHECK(off->agent()->ran() == 0);
  CHECK(unreachable->agent()->ran() == 0);
  // Known now: later fan-outs do not ask again (a link that could not be made is tried again,
  // but only after a backoff).
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(off->agent()->grants() == 1);
  CHECK(unreachable->agent()->grants() == 1);
  links.Reset(off->endpoint);
  CHECK(links.Links(off->endpoint));
}

TEST_CASE("an agent flooding sealed replies does not hold the fan-out past its deadline") {
  auto ok = Serve(std::make_unique<FakeLinkAgent>("ok", 0));
  auto flood = Serve(std::make_unique<FloodAgent>(4'000'000));  // 80 MB of valid frames
  auto* flooder = static_cast<FloodAgent*>(flood->service.get());
  AgentChannels channels;
  StepLinks links(&channels);
  const std::vector<std::string> endpoints = {ok->endpoint, flood->endpoint};
  OpenLinks(&links, endpoints, 2);
  auto commands = Commands(2);
  const auto t0 = std::chrono::steady_clock::now();
  auto answers = links.Send(endpoints, &commands, std::chrono::milliseconds(300));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO("the fan-out took " << seconds << " s");
  // Back at the deadline with most of the flood still unread, the well-behaved agent answered.
  CHECK_FALSE(flooder->flooded());
  CHECK(seconds < 2.0);
  CHECK(answers[0].status.error_message() == "ok");
  CHECK(answers[1].status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
}

TEST_CASE("a link whose handshake meets a long command is made again after a backoff") {
  auto slow = Serve(std::make_unique<FakeLinkAgent>("slow", 0));
  AgentChannels channels;
  StepLinks links(&channels);
  OpenLinks(&links, {slow->endpoint}, 1);
  // The command holds the agent's link thread for 3 s: it misses the deadline, its link is
  // closed, and the next link's handshake waits on that thread longer than the controller does.
  slow->agent()->BlockNext(std::chrono::milliseconds(3000));
  auto commands = Commands(1);
  auto answers = links.Send({slow->endpoint}, &commands, std::chrono::milliseconds(200));
  CHECK(answers[0].status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
  commands = Commands(1);
  answers = links.Send({slow->endpoint}, &commands, std::chrono::seconds(1));
  CHECK(answers[0].not_sent);
  REQUIRE(WaitFor([&] { return slow->agent()->grants() == 2; }));
  // Once the command is over, a link is made again (as later fan-outs ask for one).
  CHECK(WaitFor([&] {
    links.Request({slow->endpoint});
    return links.Has(slow->endpoint);
  }));
  CHECK(links.Links(slow->endpoint));
  commands = Commands(1);
  answers = links.Send({slow->endpoint}, &commands, std::chrono::seconds(10));
  CHECK_FALSE(answers[0].not_sent);
  CHECK(answers[0].status.error_message() == "slow");
}

}  // namespace
}  // namespace wb::controller
