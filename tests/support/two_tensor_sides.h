// Shared by the tests that kill, freeze and restart agents under a trainer and inference
// replicas (elastic_test, restart_test) and the relay tests: each side registers two BF16
// tensors (4 MiB each by default), a.weight and b.weight, from one shared buffer (OpenSide), and
// waits for the watcher events of a step.
#pragma once

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "client/weightbeam/controller_client.h"
#include "client/weightbeam/local_session.h"
#include "client/weightbeam/shared_buffer.h"
#include "tests/support/cluster.h"

namespace wb::testing::two_tensors {

// 4 MiB per tensor: quick, and more than loopback socket buffers hold at once.
inline constexpr int64_t kRows = 2048, kCols = 1024;
inline constexpr uint64_t kTensorBytes = kRows * kCols * 2;
inline constexpr uint64_t kSideBytes = 2 * kTensorBytes;
// Every Step call is given this; each must answer within it (plus a little for the RPC).
inline constexpr auto kStepTimeout = std::chrono::seconds(8);

inline std::string Message(const absl::Status& s) { return std::string(s.message()); }

// One process's side: a.weight and b.weight, rows x cols BF16 each, back to back in one buffer.
struct Side {
  client::SharedBuffer buffer;
  client::LocalSession session;
};

// A session of `role` (replica `replica`) on `socket` with both tensors registered.
inline Side OpenSide(const std::string& socket, weightbeam::v1::Role role, int replica,
                     int64_t rows = kRows, int64_t cols = kCols, const std::string& hint = "side") {
  const uint64_t tensor_bytes = static_cast<uint64_t>(rows * cols * 2);
  auto b = client::SharedBuffer::Create(2 * tensor_bytes, hint);
  REQUIRE(b.ok());
  auto s = client::LocalSession::Connect(socket, client::Identity{role, 0, replica});
  REQUIRE(s.ok());
  for (int t = 0; t < 2; ++t) {
    const std::string name = t == 0 ? "a.weight" : "b.weight";
    REQUIRE(s->Register(client::TensorInfo{name, weightbeam::v1::DTYPE_BF16, {rows, cols}, {}}, *b,
                        t * tensor_bytes, tensor_bytes)
                .ok());
  }
  return Side{std::move(*b), std::move(*s)};
}

// The agent of inference replica k.
inline std::string ReplicaAgent(int k) { return absl::StrCat("inference-", k); }

// The next event of `kind` on `session` (skipping others), or an error after `timeout`.
inline absl::StatusOr<weightbeam::v1::Event> NextEventOfKind(client::LocalSession& session,
                                                             weightbeam::v1::Event::Kind kind,
                                                             std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    auto e = session.NextEvent(std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now()));
    if (!e.ok()) return e.status();
    if (e->kind() == kind) return e;
  }
  return absl::DeadlineExceededError("no such event");
}

// A controller client once the controller answers, after planning a world of one trainer rank
// and `replicas` one-rank inference replicas; `plan` gets the plan's summary.
inline std::unique_ptr<client::ControllerClient> ConnectAndPlan(const Cluster& cluster,
                                                                int replicas,
                                                                weightbeam::v1::PlanSummary* plan) {
  auto c = client::ControllerClient::Connect(cluster.controller_address());
  REQUIRE(c.ok());
  auto ctl = std::make_unique<client::ControllerClient>(std::move(*c));
  REQUIRE(WaitUntil([&] { return ctl->Status().ok(); }, std::chrono::seconds(15)));
  weightbeam::v1::ExpectedWorld world;
  world.set_trainer_ranks(1);
  world.set_inference_replicas(replicas);
  world.set_inference_ranks_per_replica(1);
  auto planned = ctl->Plan(world, std::chrono::seconds(20));
  INFO((planned.ok() ? "" : Message(planned.status())));
  REQUIRE(planned.ok());
  *plan = *planned;
  return ctl;
}

}  // namespace wb::testing::two_tensors
