// The smallest transfer for tests against a live Cluster (tests/support/cluster.h): one BF16
// tensor on each side, registered through the agents' Unix sockets, planned one trainer rank to
// one inference rank. Uses Catch2's REQUIRE, so only for Catch2 tests.
#pragma once

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "client/weightbeam/controller_client.h"
#include "client/weightbeam/local_session.h"
#include "client/weightbeam/shared_buffer.h"
#include "tests/support/cluster.h"

namespace wb::testing {

struct OneTensorSides {
  client::SharedBuffer src, dst;
  client::LocalSession trainer, inference;
  static OneTensorSides Open(const Cluster& cluster) {
    namespace v1 = weightbeam::v1;
    auto src = client::SharedBuffer::Create(64 * 256 * 2, "src");
    auto dst = client::SharedBuffer::Create(64 * 256 * 2, "dst");
    REQUIRE((src.ok() && dst.ok()));
    auto trainer =
        client::LocalSession::Connect(cluster.socket("trainer-node"), {v1::ROLE_TRAINER, 0, 0});
    auto inference =
        client::LocalSession::Connect(cluster.socket("inference-node"), {v1::ROLE_INFERENCE, 0, 0});
    REQUIRE((trainer.ok() && inference.ok()));
    client::TensorInfo t{"lm_head.weight", v1::DTYPE_BF16, {64, 256}, {}};
    REQUIRE(trainer->Register(t, *src, 0, src->size()).ok());
    REQUIRE(inference->Register(t, *dst, 0, dst->size()).ok());
    return OneTensorSides{std::move(*src), std::move(*dst), std::move(*trainer),
                          std::move(*inference)};
  }
  void Fill(uint8_t v) { std::memset(src.data(), v, src.size()); }
  bool Same() const { return std::memcmp(src.data(), dst.data(), src.size()) == 0; }
};

// Plans one trainer rank to one inference replica of one rank; REQUIREs that it succeeds.
inline void PlanOneToOne(client::ControllerClient* ctl) {
  weightbeam::v1::ExpectedWorld world;
  world.set_trainer_ranks(1);
  world.set_inference_replicas(1);
  world.set_inference_ranks_per_replica(1);
  auto plan = ctl->Plan(world, std::chrono::seconds(20));
  INFO((plan.ok() ? "" : std::string(plan.status().message())));
  REQUIRE(plan.ok());
}

}  // namespace wb::testing
