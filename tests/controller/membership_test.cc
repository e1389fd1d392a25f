// Membership's registration rules: a new incarnation under a live agent's name is refused, unless
// it registers from the same host with the same control endpoint (the agent restarted); every
// registration bumps the layout version so the next step plans again. Also PeerHost.
#include "controller/membership.h"

#include <catch2/catch.hpp>
#include <chrono>

namespace wb::controller {
namespace {

namespace v1 = weightbeam::v1;

v1::AgentInfo Info(const std::string& name, const std::string& endpoint) {
  v1::AgentInfo info;
  info.set_name(name);
  info.set_control_endpoint(endpoint);
  return info;
}

// A layout with `tensors` empty tensor entries at `generation` (Register does not check them).
v1::AgentLayout Layout(uint64_t generation, int tensors) {
  v1::AgentLayout layout;
  layout.set_generation(generation);
  for (int i = 0; i < tensors; ++i) layout.add_tensors();
  return layout;
}

}  // namespace

TEST_CASE("PeerHost cuts the scheme and port off gRPC peer strings") {
  CHECK(PeerHost("ipv4:10.0.0.7:51234") == "10.0.0.7");
  CHECK(PeerHost("ipv6:[::1]:5") == "[::1]");
  CHECK(PeerHost("unix:/tmp/x.sock") == "unix:/tmp/x.sock");
  CHECK(PeerHost("") == "");
}

TEST_CASE("a restarted agent (same host and endpoint, new incarnation) takes its place at once") {
  Membership m(1, std::chrono::milliseconds(60000));  // nobody is lost during the test
  REQUIRE(m.Register(Info("trainer-0", "10.0.0.7:7100"), Layout(2, 2), "first", "10.0.0.7").ok());
  const uint64_t before = m.layout_version();

  SECTION("the same layout again, from the restarted process") {
    // Same generation and tensor count as before: only the incarnation says it is new.
    // The process at the endpoint answers as the registering one (the controller asks its
    // Health for the incarnation digest).
    int asked = 0;
    REQUIRE(m.Register(Info("trainer-0", "10.0.0.7:7100"), Layout(2, 2), "second", "10.0.0.7", [&] {
               return ++asked > 0;
             }).ok());
    CHECK(asked == 1);
    CHECK(m.layout_version() > before);
    CHECK(m.IsIncarnation("trainer-0", "second"));
    CHECK_FALSE(m.IsIncarnation("trainer-0", "first"));
    // The old incarnation's heartbeats are told to register again.
    v1::HeartbeatRequest hb;
    hb.set_agent("trainer-0");
    hb.set_epoch(1);
    hb.set_incarnation("first");
    CHECK(m.Heartbeat(hb).reregister());
    hb.set_incarnation("second");
    CHECK_FALSE(m.Heartbeat(hb).reregister());
  }
  SECTION("the same host and endpoint, but the process there is still the old one: refused") {
    // A local impostor claiming the live agent's endpoint: the agent listening there answers
    // with its own incarnation's digest, not the caller's.
    auto s = m.Register(Info("trainer-0", "10.0.0.7:7100"), Layout(0, 0), "impostor", "10.0.0.7",
                        [] { return false; });
    CHECK(s.code() == absl::StatusCode::kAlreadyExists);
    CHECK(m.IsIncarnation("trainer-0", "first"));
    CHECK(m.layout_version() == before);
    // Without a way to ask the endpoint, no takeover either.
    CHECK(m.Register(Info("trainer-0", "10.0.0.7:7100"), Layout(0, 0), "impostor", "10.0.0.7")
              .code() == absl::StatusCode::kAlreadyExists);
  }
  SECTION("another endpoint under the name is refused while the agent lives") {
    auto s = m.Register(Info("trainer-0", "10.0.0.8:7100"), Layout(0, 0), "other", "10.0.0.8",
                        [] { return true; });
    CHECK(s.code() == absl::StatusCode::kAlreadyExists);
    CHECK_THAT(std::string(s.message()), Catch::Contains("held by a live agent at 10.0.0.7:7100"));
    CHECK(m.IsIncarnation("trainer-0", "first"));
    CHECK(m.layout_version() == before);
  }
  SECTION("the same endpoint claimed from another host is refused") {
    auto s = m.Register(Info("trainer-0", "10.0.0.7:7100"), Layout(0, 0), "other", "10.0.0.9",
                        [] { return true; });
    CHECK(s.code() == absl::StatusCode::kAlreadyExists);
    CHECK(m.IsIncarnation("trainer-0", "first"));
  }
  SECTION("a caller whose host is unknown is refused") {
    auto s = m.Register(Info("trainer-0", "10.0.0.7:7100"), Layout(0, 0), "other", "",
                        [] { return true; });
    CHECK(s.code() == absl::StatusCode::kAlreadyExists);
  }
  SECTION("the same incarnation registering again is accepted and bumps the version") {
    REQUIRE(m.Register(Info("trainer-0", "10.0.0.7:7100"), Layout(2, 2), "first", "10.0.0.7").ok());
    CHECK(m.layout_version() > before);
  }
}

}  // namespace wb::controller
