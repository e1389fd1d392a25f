// wbctl against real daemons: --json output parses and carries the cluster's state; a step
// through wbctl commits; a controller that is down gives one line and exit code 2.
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>

#include "client/weightbeam/local_session.h"
#include "client/weightbeam/shared_buffer.h"
#include "tests/support/cluster.h"

namespace v1 = weightbeam::v1;
using namespace wb::client;
using wb::testing::Cluster;
using wb::testing::Output;
using wb::testing::Process;
using wb::testing::Wbctl;

namespace {

nlohmann::json Json(const Output& o) {
  INFO(o.text);
  REQUIRE(o.code == 0);
  return nlohmann::json::parse(o.text);
}

}  // namespace

TEST_CASE("wbctl --json reports agents, tensors, the plan and steps of a live cluster") {
  Cluster cluster(wb::testing::Runfile(""), {});
  auto src = SharedBuffer::Create(64 * 256 * 2, "src");
  auto dst = SharedBuffer::Create(64 * 256 * 2, "dst");
  REQUIRE((src.ok() && dst.ok()));
  auto trainer = LocalSession::Connect(cluster.socket("trainer-node"), {v1::ROLE_TRAINER, 0, 0});
  auto inference =
      LocalSession::Connect(cluster.socket("inference-node"), {v1::ROLE_INFERENCE, 0, 0});
  REQUIRE((trainer.ok() && inference.ok()));
  TensorInfo t{"lm_head.weight", v1::DTYPE_BF16, {64, 256}, {}};
  REQUIRE(trainer->Register(t, *src, 0, src->size()).ok());
  REQUIRE(inference->Register(t, *dst, 0, dst->size()).ok());
  std::memset(src->data(), 0x3c, src->size());
  const std::string ctl = "--controller=" + cluster.controller_address();

  // Agents register within a heartbeat or two.
  REQUIRE(wb::testing::WaitUntil(
      [&] {
        auto o = Wbctl(cluster.dir(), {ctl, "--json", "agents"});
        return o.code == 0 && nlohmann::json::parse(o.text)["agents"].size() == 2;
      },
      std::chrono::seconds(15)));
  auto agents = Json(Wbctl(cluster.dir(), {ctl, "--json", "agents"}));
  std::set<std::string> names;
  for (const auto& a : agents["agents"]) {
    names.insert(a["info"]["name"]);
    CHECK(a["state"] == "alive");
  }
  CHECK(names == std::set<std::string>{"inference-node", "trainer-node"});

  auto tensors = Json(Wbctl(cluster.dir(), {ctl, "--json", "tensors", "--agent", "trainer-node"}));
  REQUIRE(tensors["layouts"].size() == 1);
  const auto& tl = tensors["layouts"][0]["tensors"][0];
  CHECK(tl["spec"]["name"] == "lm_head.weight");
  CHECK(tl["spec"]["dtype"] == "DTYPE_BF16");
  CHECK(tl["owner"]["role"] == "ROLE_TRAINER");

  auto plan = Json(Wbctl(cluster.dir(), {ctl, "--json", "plan", "--create", "--wait-ms", "10000"}));
  CHECK(plan["total_bytes"] == std::to_string(64 * 256 * 2));  // uint64 is a JSON string
  CHECK(plan["senders"][0]["agent"] == "trainer-node");
  CHECK(plan["receivers"][0]["agent"] == "inference-node");

  auto step = Json(Wbctl(cluster.dir(), {ctl, "--json", "step", "7"}));
  CHECK(step["ok"] == true);
  CHECK(step["version"] == "7");
  CHECK(std::memcmp(src->data(), dst->data(), src->size()) == 0);

  auto status = Json(Wbctl(cluster.dir(), {ctl, "--json", "status"}));
  CHECK(status["last_committed_version"] == "7");
  CHECK(status["recent_steps"].size() == 1);

  // Human output: an aligned table with a header.
  auto table = Wbctl(cluster.dir(), {ctl, "agents"});
  CHECK(table.code == 0);
  CHECK_THAT(table.text, Catch::StartsWith("AGENT") && Catch::Contains("trainer-node"));

  // A refused step is exit code 2 with the controller's reason.
  auto old = Wbctl(cluster.dir(), {ctl, "step", "3"});
  CHECK(old.code == 2);
  CHECK_THAT(old.text, Catch::Contains("version 3 is not newer than the last committed version 7"));
}

TEST_CASE("wbctl against a controller that is down: one line, exit code 2") {
  const std::string dir = wb::testing::TempDir("wbctl-");
  auto o =
      Wbctl(dir, {"--controller=127.0.0.1:" + std::to_string(wb::testing::FreePort()), "status"});
  CHECK(o.code == 2);
  CHECK_THAT(o.text, Catch::StartsWith("wbctl: controller at 127.0.0.1:") &&
                         Catch::Contains("is unreachable"));
  CHECK(std::count(o.text.begin(), o.text.end(), '\n') == 1);
}
