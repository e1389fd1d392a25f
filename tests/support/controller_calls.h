// Controller-client shorthands that tests and benchmarks share: an ExpectedWorld in one call,
// how many tensors the controller lists for an agent, stepping until a step commits. Free of
// Catch2.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "client/weightbeam/controller_client.h"

namespace wb::testing {

// The world a plan covers: `trainer_ranks` trainer ranks, `replicas` inference replicas of
// `ranks_per_replica` ranks each.
inline weightbeam::v1::ExpectedWorld World(int trainer_ranks, int replicas, int ranks_per_replica) {
  weightbeam::v1::ExpectedWorld world;
  world.set_trainer_ranks(trainer_ranks);
  world.set_inference_replicas(replicas);
  world.set_inference_ranks_per_replica(ranks_per_replica);
  return world;
}

// Tensors the controller lists for `agent`; -1 when the call fails.
inline int64_t ListedTensors(client::ControllerClient& ctl, const std::string& agent) {
  auto listed = ctl.ListTensors(agent);
  if (!listed.ok()) return -1;
  int64_t n = 0;
  for (const auto& layout : listed->layouts()) n += layout.tensors_size();
  return n;
}

// Tensors the controller's status counts over all agents; -1 when the call fails.
inline int64_t StatusTensors(client::ControllerClient& ctl) {
  auto status = ctl.Status();
  if (!status.ok()) return -1;
  int64_t n = 0;
  for (const auto& agent : status->agents()) n += agent.tensors();
  return n;
}

// Steps from `*version` on, one new version per try, 200 ms apart, until one commits or `tries`
// run out; returns the last result. For steps that must wait for agents to come back.
inline absl::StatusOr<weightbeam::v1::StepResult> StepUntilCommitted(client::ControllerClient& ctl,
                                                                     uint64_t* version,
                                                                     int tries = 50) {
  absl::StatusOr<weightbeam::v1::StepResult> r = absl::UnknownError("not run");
  for (int i = 0; i < tries; ++i) {
    r = ctl.Step((*version)++);
    if (r.ok()) return r;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return r;
}

}  // namespace wb::testing
