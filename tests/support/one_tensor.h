// The smallest transfer for tests against a live Cluster (tests/support/cluster.h): one tensor
// on each side, registered through the agents' Unix sockets, planned one trainer rank to one
// inference rank. Uses Catch2's REQUIRE, so only for Catch2 tests.
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
#include "common/tensor/dtype.h"
#include "tests/support/cluster.h"
#include "tests/support/controller_calls.h"

namespace wb::testing {

// The tensor each side registers and the agents the sides register with. Differing dtypes
// make the sending agent cast on its CPU.
struct OneTensorShape {
  std::string name = "lm_head.weight";
  int64_t rows = 64, cols = 256;
  weightbeam::v1::DType src_dtype = weightbeam::v1::DTYPE_BF16;
  weightbeam::v1::DType dst_dtype = weightbeam::v1::DTYPE_BF16;
  std::string trainer_agent = "trainer-node";
  std::string inference_agent = "inference-node";
};

struct OneTensorSides {
  client::SharedBuffer src, dst;
  client::LocalSession trainer, inference;
  static OneTensorSides Open(const Cluster& cluster, const OneTensorShape& shape = {}) {
    namespace v1 = weightbeam::v1;
    const uint64_t elements = uint64_t(shape.rows * shape.cols);
    auto src = client::SharedBuffer::Create(elements * tensor::DTypeBytes(shape.src_dtype), "src");
    auto dst = client::SharedBuffer::Create(elements * tensor::DTypeBytes(shape.dst_dtype), "dst");
    REQUIRE((src.ok() && dst.ok()));
    auto trainer = client::LocalSession::Connect(cluster.socket(shape.trainer_agent),
                                                 {v1::ROLE_TRAINER, 0, 0});
    auto inference = client::LocalSession::Connect(cluster.socket(shape.inference_agent),
                                                   {v1::ROLE_INFERENCE, 0, 0});
    REQUIRE((trainer.ok() && inference.ok()));
    REQUIRE(trainer
                ->Register({shape.name, shape.src_dtype, {shape.rows, shape.cols}, {}}, *src, 0,
                           src->size())
                .ok());
    REQUIRE(inference
                ->Register({shape.name, shape.dst_dtype, {shape.rows, shape.cols}, {}}, *dst, 0,
                           dst->size())
                .ok());
    return OneTensorSides{std::move(*src), std::move(*dst), std::move(*trainer),
                          std::move(*inference)};
  }
  void Fill(uint8_t v) { std::memset(src.data(), v, src.size()); }
  bool Same() const { return std::memcmp(src.data(), dst.data(), src.size()) == 0; }
};

// The result of a step that must have committed; REQUIREs it (showing the error).
inline weightbeam::v1::StepResult RequireCommitted(
    const absl::StatusOr<weightbeam::v1::StepResult>& step) {
  INFO((step.ok() ? "" : std::string(step.status().message())));
  REQUIRE(step.ok());
  return *step;
}

// A client of the cluster's controller; REQUIREs that it connects and (the controller may still
// be starting) that the controller answers within 15 s.
inline client::ControllerClient ConnectController(const Cluster& cluster) {
  auto ctl = client::ControllerClient::Connect(cluster.controller_address());
  REQUIRE(ctl.ok());
  REQUIRE(WaitUntil([&] { return ctl->Status().ok(); }, std::chrono::seconds(15)));
  return std::move(*ctl);
}

// Plans `world`, waiting up to `wait` for it; REQUIREs that it succeeds (showing the error).
inline weightbeam::v1::PlanSummary PlanWorld(
    client::ControllerClient* ctl, const weightbeam::v1::ExpectedWorld& world,
    std::chrono::milliseconds wait = std::chrono::seconds(20)) {
  auto plan = ctl->Plan(world, wait);
  INFO((plan.ok() ? "" : std::string(plan.status().message())));
  REQUIRE(plan.ok());
  return *plan;
}

// Plans one trainer rank to one inference replica of one rank; REQUIREs that it succeeds.
inline weightbeam::v1::PlanSummary PlanOneToOne(
    client::ControllerClient* ctl, std::chrono::milliseconds wait = std::chrono::seconds(20)) {
  return PlanWorld(ctl, World(1, 1, 1), wait);
}

}  // namespace wb::testing
