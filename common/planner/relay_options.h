// Whether and how the planner relays (relay.h): its own header so that the controller's
// configuration can hold it without the planner (as it holds the cost model).
#pragma once

namespace wb::planner {

struct RelayOptions {
  // Later inference replicas may take their bytes from an earlier replica's agent where the
  // cost model predicts a faster step. Agents forward over tcp and local only.
  bool enabled = false;
  // 0: chosen by the cost model. Else forced (tests, operators): the first `roots` members of
  // every replica family are fed by the senders, each later one by a relay with at most
  // `fanout` children.
  int roots = 0;
  int fanout = 0;
  // With relays, senders also hold the direct ops to every relayed replica (TransferOp
  // fallback), run only when its relay is dropped from a step, so its children are fed in that
  // same step (StepProtocol). Costs the senders what a plan without relays holds. Set by the
  // controller (off in delta mode), not a configuration key.
  bool direct_fallback = false;
};

}  // namespace wb::planner
