// What the controller learns from committed steps: link rates (controller/link_learning.h) and
// the delta step prediction (controller/delta_prediction.h). Step results are built here with
// figures whose expected consequences are worked out by hand in the comments.
#include <catch2/catch.hpp>

#include "controller/delta_prediction.h"
#include "controller/link_learning.h"

namespace v1 = weightbeam::v1;
using wb::controller::DeltaStepPredictor;
using wb::controller::LinkLearner;

namespace {

constexpr uint64_t kMB = 1000000;

void AddSender(v1::StepResult* r, const std::string& agent, uint64_t bytes, double seconds,
               uint64_t dense = 0) {
  v1::AgentStepReport* a = r->add_agents();
  a->set_agent(agent);
  a->set_ok(true);
  a->set_bytes_sent(bytes);
  a->set_bytes_dense(dense);
  a->set_seconds(seconds);
}

// Four senders rated 0.025 GB/s (200 Mbit/s); `slow` took `factor` times as long for the same
// 200 MB (the others: 8 s, at their rating).
v1::StepResult DenseStep(const std::string& slow, double factor) {
  v1::StepResult r;
  r.set_ok(true);
  for (const char* agent : {"trainer-0", "trainer-1", "trainer-2", "trainer-3"}) {
    AddSender(&r, agent, 200 * kMB, agent == slow ? 8 * factor : 8);
  }
  return r;
}

const std::map<std::string, double> kRated = {
    {"trainer-0", 0.025}, {"trainer-1", 0.025}, {"trainer-2", 0.025}, {"trainer-3", 0.025}};

}  // namespace

TEST_CASE(
    "a link at a quarter of its rate is learned at once, and a plan made without it is "
    "out of date") {
  LinkLearner l;
  CHECK(l.Observe(DenseStep("", 1), kRated).empty());  // all alike: nothing learned
  CHECK(l.Scales().empty());
  const std::string said = l.Observe(DenseStep("trainer-0", 4), kRated);
  CHECK(said.find("trainer-0") != std::string::npos);
  REQUIRE(l.Scales().size() == 1);
  CHECK(l.Scales().at("trainer-0") == Approx(0.25));  // a jump (> 30 %): taken as measured
  const std::string why = l.ReplanReason({});
  CHECK(why.find("trainer-0's link at 0.25") != std::string::npos);
  // A plan made with 0.25 is current; one made with 0.22 too (within 20 %).
  CHECK(l.ReplanReason({{"trainer-0", 0.25}}).empty());
  CHECK(l.ReplanReason({{"trainer-0", 0.22}}).empty());
}

TEST_CASE("small changes are smoothed; a recovered link is forgotten; bounds hold") {
  LinkLearner l;
  l.Observe(DenseStep("trainer-0", 4), kRated);
  // Measured 0.3 next (within 30 % of 0.25): 0.25 + 0.3 x (0.3 - 0.25) = 0.265.
  l.Observe(DenseStep("trainer-0", 1 / 0.3), kRated);
  CHECK(l.Scales().at("trainer-0") == Approx(0.265));
  // Back at full speed (a jump up): taken once kConfirmSteps steps in a row say so; then
  // forgotten, and a plan that assumed 0.265 is out of date.
  for (int i = 1; i < LinkLearner::kConfirmSteps; ++i) {
    l.Observe(DenseStep("", 1), kRated);
    CHECK(l.Scales().at("trainer-0") == Approx(0.265));
  }
  l.Observe(DenseStep("", 1), kRated);
  CHECK(l.Scales().empty());
  CHECK(!l.ReplanReason({{"trainer-0", 0.265}}).empty());
  // A link 100x slower is taken for 1/16 (the floor), not for dead.
  l.Observe(DenseStep("trainer-2", 100), kRated);
  CHECK(l.Scales().at("trainer-2") == Approx(1.0 / 16));
}

TEST_CASE("steps that say nothing about links teach nothing") {
  LinkLearner l;
  v1::StepResult failed = DenseStep("trainer-0", 4);
  failed.set_ok(false);
  CHECK(l.Observe(failed, kRated).empty());
  v1::StepResult delta = DenseStep("trainer-0", 4);
  delta.set_delta_ops(10);  // CPU-bound, a few bytes
  CHECK(l.Observe(delta, kRated).empty());
  v1::StepResult tiny;  // under 1 MB per sender
  tiny.set_ok(true);
  AddSender(&tiny, "trainer-0", 1000, 1);
  AddSender(&tiny, "trainer-1", 1000, 0.001);
  CHECK(l.Observe(tiny, kRated).empty());
  CHECK(l.Scales().empty());
  // Rated speeds count: trainer-1 rated twice as fast moving the same bytes in the same time is
  // at half its rating, so it is the slow one.
  v1::StepResult same = DenseStep("", 1);
  auto rated = kRated;
  rated["trainer-1"] = 0.05;
  l.Observe(same, rated);
  CHECK(l.Scales().size() == 1);
  CHECK(l.Scales().at("trainer-1") == Approx(0.5));
}

// Issue 41, item 10: every figure is the agent's own; no agent decides for the others, and
// the estimates are damped in time.
TEST_CASE("one agent reporting gbps 0.001 or inflated bytes does not price the others down") {
  SECTION("a rating of 0.001 GB/s") {
    LinkLearner l;
    auto rated = kRated;
    rated["trainer-3"] = 0.001;  // it moved as much as the others: 25x its "rating"
    l.Observe(DenseStep("", 1), rated);
    INFO("scales: " << l.Scales().size());
    CHECK(l.Scales().empty());
  }
  SECTION("bytes_sent inflated 100x") {
    LinkLearner l;
    v1::StepResult r = DenseStep("", 1);
    r.mutable_agents(3)->set_bytes_sent(100 * 200 * kMB);
    l.Observe(r, kRated);
    CHECK(l.Scales().empty());
  }
  SECTION("with two senders, at most 1/4 (kMaxLead)") {
    LinkLearner l;
    v1::StepResult r;
    r.set_ok(true);
    AddSender(&r, "trainer-0", 200 * kMB, 8);
    AddSender(&r, "trainer-1", 200 * kMB, 8);
    auto rated = kRated;
    rated["trainer-1"] = 0.001;
    l.Observe(r, rated);
    REQUIRE(l.Scales().count("trainer-0"));
    CHECK(l.Scales().at("trainer-0") == Approx(0.25));  // 1 / LinkLearner::kMaxLead
    CHECK(l.Scales().at("trainer-0") > LinkLearner::kFloor);
  }
  SECTION("a real slow link among two senders is still learned") {
    LinkLearner l;
    v1::StepResult r;
    r.set_ok(true);
    AddSender(&r, "trainer-0", 200 * kMB, 8);
    AddSender(&r, "trainer-1", 200 * kMB, 32);
    l.Observe(r, kRated);
    REQUIRE(l.Scales().count("trainer-1"));
    CHECK(l.Scales().at("trainer-1") == Approx(0.25));
  }
}

TEST_CASE("a link flapping between 0.5 and 1.0 does not replan every step") {
  LinkLearner l;
  std::map<std::string, double> planned;  // what the current plan assumed
  int replans = 0;
  for (int step = 0; step < 12; ++step) {
    l.Observe(DenseStep(step % 2 == 0 ? "trainer-0" : "", step % 2 == 0 ? 2 : 1), kRated);
    if (!l.ReplanReason(planned).empty()) {
      ++replans;
      planned = l.Scales();
    }
  }
  INFO(replans << " replans in 12 steps");
  CHECK(replans <= 1);
  REQUIRE(l.Scales().count("trainer-0"));
  CHECK(l.Scales().at("trainer-0") == Approx(0.5));  // priced at the slower of the two
}

TEST_CASE("an agent priced down and then idle decays back toward its rating") {
  LinkLearner l;
  l.Observe(DenseStep("trainer-0", 16), kRated);
  REQUIRE(l.Scales().at("trainer-0") == Approx(1.0 / 16));
  // The replan gave trainer-0 nothing: it is in no later step's reports.
  v1::StepResult without;
  without.set_ok(true);
  for (const char* agent : {"trainer-1", "trainer-2", "trainer-3"}) {
    AddSender(&without, agent, 200 * kMB, 8);
  }
  int steps = 0;
  while (l.Scales().count("trainer-0") && steps < 100) {
    const double before = l.Scales().at("trainer-0");
    l.Observe(without, kRated);
    ++steps;
    if (l.Scales().count("trainer-0")) CHECK(l.Scales().at("trainer-0") > before);
  }
  INFO(steps << " steps");
  CHECK(l.Scales().empty());
  CHECK(steps < 40);
}

TEST_CASE("relays are measured by what they forward, not by the time they wait for bytes") {
  const std::map<std::string, double> rated = {{"trainer-0", 0.025},
                                               {"trainer-1", 0.025},
                                               {"trainer-2", 0.025},
                                               {"trainer-3", 0.025},
                                               {"relay-0", 0.025}};
  auto relay = [](v1::StepResult* r, double forward_seconds) {
    AddSender(r, "relay-0", 200 * kMB, 64);  // waited for its bytes most of the step
    v1::AgentStepReport* a = r->mutable_agents(r->agents_size() - 1);
    a->set_bytes_forwarded(200 * kMB);
    a->set_forward_seconds(forward_seconds);
  };
  LinkLearner l;
  v1::StepResult r = DenseStep("", 1);
  relay(&r, 8);  // forwarded at its rating, like the senders (200 MB in 8 s)
  l.Observe(r, rated, {"relay-0"});
  CHECK(l.Scales().empty());
  // Its forwarding takes 4 times as long: its link is slow, whatever it waited.
  v1::StepResult slow = DenseStep("", 1);
  relay(&slow, 32);
  const std::string said = l.Observe(slow, rated, {"relay-0"});
  CHECK(said.find("relay-0") != std::string::npos);
  REQUIRE(l.Scales().count("relay-0") == 1);
  CHECK(l.Scales().at("relay-0") == Approx(0.25));
  // A relay that forwarded nothing measurable says nothing (it decays back).
  v1::StepResult idle = DenseStep("", 1);
  AddSender(&idle, "relay-0", 0, 64);
  l.Observe(idle, rated, {"relay-0"});
  CHECK(l.Scales().at("relay-0") > 0.25);
}

TEST_CASE("a delta step is predicted from configured rates, then from measured ones") {
  wb::config::DeltaConfig c;
  c.predict_changed_fraction = 0.01;  // packed: 2 %
  c.predict_encode_gbps = 0.5;
  c.predict_apply_gbps = 0.1;
  DeltaStepPredictor p(c);
  v1::PlanSummary plan;
  for (const char* agent : {"t0", "t1"}) {
    v1::PeerBytes* s = plan.add_senders();
    s->set_agent(agent);
    s->set_bytes(100 * kMB);
  }
  v1::PeerBytes* r = plan.add_receivers();
  r->set_agent("i0");
  r->set_bytes(200 * kMB);
  plan.set_link_limit_seconds(8);
  plan.set_predicted_step_seconds(8.5);  // 0.5 s of per-op costs
  auto first = p.Predict(plan);
  // encode 100 MB / 0.5 GB/s = 0.2 s; send 8 x 0.02 + 0.5 = 0.66 s; apply 200 MB x 0.02 /
  // 0.1 GB/s = 0.04 s; step max(0.2, 0.66) + 0.04 = 0.70 s.
  CHECK(first.encode_seconds == Approx(0.2));
  CHECK(first.send_seconds == Approx(0.66));
  CHECK(first.apply_seconds == Approx(0.04));
  CHECK(first.seconds == Approx(0.70));
  CHECK(first.basis.find("configured") != std::string::npos);

  // A measured delta step: t0 took 1 s and t1 0.5 s for their 100 MB dense; 4 MB sent of
  // 200 MB dense (2 %); the step took 1.2 s, 0.2 s after its slowest sender.
  v1::StepResult step;
  step.set_ok(true);
  step.set_delta_ops(100);
  step.set_bytes(4 * kMB);
  step.set_bytes_dense(200 * kMB);
  step.set_seconds(1.2);
  AddSender(&step, "t0", 2 * kMB, 1.0, 100 * kMB);
  AddSender(&step, "t1", 2 * kMB, 0.5, 100 * kMB);
  p.Observe(step, plan);
  auto second = p.Predict(plan);
  // encode: t0 at 0.1 GB/s -> 1 s; apply: 200 MB x 0.02 over 0.2 s = 0.02 GB/s -> 0.2 s;
  // send 0.66 s; step max(1, 0.66) + 0.2 = 1.2 s: the measured step again.
  CHECK(second.encode_seconds == Approx(1.0));
  CHECK(second.apply_seconds == Approx(0.2));
  CHECK(second.seconds == Approx(1.2));
  CHECK(second.basis.find("measured over 1") != std::string::npos);
  // Twice as many changes next time (4 %) in the same times: the packed fraction is smoothed
  // to 3 % (half of the new measurement), the apply rate measured 200 MB x 0.04 / 0.2 s =
  // 0.04 GB/s is smoothed to 0.03 GB/s: apply 6 MB / 0.03 GB/s = 0.2 s.
  step.set_bytes(8 * kMB);
  p.Observe(step, plan);
  auto third = p.Predict(plan);
  CHECK(third.packed_fraction == Approx(0.03));
  CHECK(third.apply_seconds == Approx(0.2));
  // Anchors and dense steps are not delta steps: nothing changes.
  v1::StepResult anchor = step;
  anchor.set_delta_anchor(true);
  p.Observe(anchor, plan);
  CHECK(p.Predict(plan).seconds == Approx(third.seconds));
}
