// The elastic inference fleet with real processes: a trainer and two or three inference replicas
// (one agent each) on loopback. A replica's agent SIGKILLed between steps or mid-step, frozen past
// the heartbeat timeout, restarted, or a brand-new replica added: training keeps committing to
// the healthy replicas (the step result lists the others), a replica that returns receives the
// next step in full before it announces commit, and every committed byte is compared on every
// serving replica, in dense and in delta mode. `min_replicas` refuses steps below the floor.
#include <httplib.h>
#include <signal.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/weightbeam/controller_client.h"
#include "client/weightbeam/local_session.h"
#include "client/weightbeam/shared_buffer.h"
#include "tests/support/cluster.h"
#include "tests/support/two_tensor_sides.h"

namespace v1 = weightbeam::v1;
using namespace wb::client;
using wb::testing::Cluster;
using Clock = std::chrono::steady_clock;

namespace {

using namespace wb::testing::two_tensors;

absl::StatusOr<LocalSession> RegisterSide(const std::string& socket, Identity who,
                                          const SharedBuffer& buffer, int tensors = 2) {
  auto s = LocalSession::Connect(socket, who);
  if (!s.ok()) return s.status();
  for (int i = 0; i < tensors; ++i) {
    TensorInfo t{i == 0 ? "a.weight" : "b.weight", v1::DTYPE_BF16, {kRows, kCols}, {}};
    if (auto r = s->Register(t, buffer, i * kTensorBytes, kTensorBytes); !r.ok()) return r;
  }
  return s;
}

// The trainer's weights: version v rewrites a third of the elements (which third depends on v),
// so a replica that misses a version and then applies a delta on its old base ends up wrong.
struct Trainer {
  SharedBuffer buffer;
  LocalSession session;
  void Advance(uint64_t v) {
    auto* p = static_cast<uint16_t*>(buffer.data());
    for (uint64_t i = 0; i < kSideBytes / 2; ++i) {
      if ((i / 64 + v) % 3 == 0) p[i] = static_cast<uint16_t>(0x3c00 + ((i * 7 + v * 13) & 0x3ff));
    }
  }
};

// One inference replica's worker: its buffer outlives its sessions (it registers again after
// its agent restarts, as a real worker would).
struct Replica {
  int index = 0;
  std::unique_ptr<SharedBuffer> buffer;
  std::unique_ptr<LocalSession> session;
  // `tensors` < 2: a worker part way through registering (it registers one tensor at a time).
  absl::Status Register(const Cluster& cluster, int tensors = 2) {
    session.reset();
    auto s = RegisterSide(cluster.socket(ReplicaAgent(index)), {v1::ROLE_INFERENCE, 0, index},
                          *buffer, tensors);
    if (!s.ok()) return s.status();
    session = std::make_unique<LocalSession>(std::move(*s));
    return session->Watch();
  }
  // The next event of `kind` (skipping others), or an error after `timeout`.
  absl::StatusOr<v1::Event> Next(v1::Event::Kind kind, std::chrono::milliseconds timeout) {
    return NextEventOfKind(*session, kind, timeout);
  }
};

struct Fleet {
  std::unique_ptr<Cluster> cluster;
  std::unique_ptr<Trainer> trainer;
  std::vector<std::unique_ptr<Replica>> replicas;
  std::unique_ptr<ControllerClient> ctl;
  uint64_t version = 0;
  bool delta = false;
  int metrics_port = 0;  // the controller's /metrics

  Fleet(int n, bool delta_mode, int min_replicas = 1) : delta(delta_mode) {
    wb::testing::ClusterOptions opts;
    opts.agents = {"trainer-node"};
    for (int k = 0; k < n; ++k) opts.agents.push_back(ReplicaAgent(k));
    opts.inference_replicas = n;
    opts.heartbeat_timeout_ms = 1500;
    metrics_port = wb::testing::FreePort();
    opts.extra_controller_yaml = absl::StrCat("min_replicas: ", min_replicas,
                                              "\nmetrics_listen: 127.0.0.1:", metrics_port, "\n");
    if (delta) {
      opts.extra_controller_yaml += "delta:\n  enabled: true\n  anchor_every: 8\n  verify: true\n";
    }
    cluster = std::make_unique<Cluster>(wb::testing::Runfile(""), opts);
    auto tb = SharedBuffer::Create(kSideBytes, "el-trainer");
    REQUIRE(tb.ok());
    auto ts = RegisterSide(cluster->socket("trainer-node"), {v1::ROLE_TRAINER, 0, 0}, *tb);
    INFO((ts.ok() ? "" : Message(ts.status())));
    REQUIRE(ts.ok());
    trainer.reset(new Trainer{std::move(*tb), std::move(*ts)});
    for (int k = 0; k < n; ++k) AddReplica(k);
    v1::PlanSummary plan;
    ctl = ConnectAndPlan(*cluster, n, &plan);
    CHECK(plan.delta().enabled() == delta);
  }

  Replica& AddReplica(int k) {
    auto r = std::make_unique<Replica>();
    r->index = k;
    auto b = SharedBuffer::Create(kSideBytes, absl::StrCat("el-inf", k));
    REQUIRE(b.ok());
    std::memset(b->data(), 0xEE, kSideBytes);
    r->buffer = std::make_unique<SharedBuffer>(std::move(*b));
    auto s = r->Register(*cluster);
    INFO(Message(s));
    REQUIRE(s.ok());
    replicas.push_back(std::move(r));
    return *replicas.back();
  }

  // One step with a fresh version; every Step answers within its deadline.
  absl::StatusOr<v1::StepResult> Step(std::optional<uint32_t> max_staleness = std::nullopt,
                                      std::chrono::milliseconds timeout = kStepTimeout) {
    ++version;
    trainer->Advance(version);
    const auto t0 = Clock::now();
    auto r = ctl->Step(version, timeout, max_staleness);
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    INFO("step " << version << " took " << seconds
                 << " s: " << (r.ok() ? "committed" : Message(r.status())));
    CHECK(seconds < std::chrono::duration<double>(timeout).count() + 3);
    return r;
  }

  // The value of `name{replica="k"}` on the controller's /metrics, or -1 when absent.
  double Gauge(const std::string& name, int k) {
    httplib::Client http("127.0.0.1", metrics_port);
    auto res = http.Get("/metrics");
    REQUIRE(res);
    REQUIRE(res->status == 200);
    const std::string key = absl::StrCat(name, "{replica=\"", k, "\"} ");
    std::istringstream lines(res->body);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind(key, 0) == 0) return std::strtod(line.c_str() + key.size(), nullptr);
    }
    return -1;
  }

  // `wbctl status`'s replica row for replica k: {state, committed, staleness}, from the
  // human table (columns REPLICA STATE COMMITTED STALENESS AGENTS).
  std::vector<std::string> WbctlRow(int k) {
    auto o = wb::testing::Wbctl(cluster->dir(),
                                {"--controller=" + cluster->controller_address(), "status"});
    INFO(o.text);
    REQUIRE(o.code == 0);
    std::istringstream lines(o.text);
    bool in_table = false;
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("inference replicas", 0) == 0) in_table = true;
      if (!in_table) continue;
      std::istringstream words(line);
      std::vector<std::string> w;
      for (std::string x; words >> x;) w.push_back(x);
      if (w.size() >= 4 && w[0] == std::to_string(k)) return {w[1], w[2], w[3]};
    }
    FAIL("no row for replica " << k << " in wbctl status");
    return {};
  }

  static std::set<int> Skipped(const v1::StepResult& r) {
    std::set<int> out;
    for (const auto& s : r.skipped_replicas()) out.insert(s.replica());
    return out;
  }

  // Every replica the step committed holds the trainer's bytes and saw commit(version).
  void VerifyCommitted(const v1::StepResult& r) {
    std::set<int> committed(r.committed_replicas().begin(), r.committed_replicas().end());
    for (auto& rep : replicas) {
      if (!committed.count(rep->index)) continue;
      INFO("replica " << rep->index << " at version " << r.version());
      CHECK(std::memcmp(trainer->buffer.data(), rep->buffer->data(), kSideBytes) == 0);
      auto e = rep->Next(v1::Event::KIND_COMMIT, std::chrono::seconds(5));
      REQUIRE(e.ok());
      CHECK(e->version() == r.version());
    }
  }

  // Two steps to every replica, so that delta mode has a base everywhere.
  void WarmUp() {
    std::set<int> all;
    for (const auto& rep : replicas) all.insert(rep->index);
    StepUntilServing(all);
    StepUntilServing(all);
  }

  // One step that must commit to every replica but those in `skipped`; verified; returns it.
  v1::StepResult StepSkipping(const std::set<int>& skipped) {
    auto r = Step();
    INFO((r.ok() ? "" : Message(r.status())));
    REQUIRE(r.ok());
    CHECK(Skipped(*r) == skipped);
    VerifyCommitted(*r);
    return *r;
  }

  // Steps until one commits to every replica in `want` (bounded); returns it.
  v1::StepResult StepUntilServing(const std::set<int>& want, int tries = 40) {
    for (int i = 0; i < tries; ++i) {
      auto r = Step();
      if (r.ok()) {
        VerifyCommitted(*r);
        std::set<int> got(r->committed_replicas().begin(), r->committed_replicas().end());
        if (got == want) return *r;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(150));
    }
    FAIL("no step committed to every replica wanted within " << tries << " tries");
    return {};
  }

  v1::ReplicaStatus ReplicaState(int k) {
    auto s = ctl->Status();
    REQUIRE(s.ok());
    for (const auto& r : s->replicas()) {
      if (r.replica() == k) return r;
    }
    return {};
  }
};

}  // namespace

TEST_CASE("a replica's agent SIGKILLed between steps: training goes on; restarted, it catches up") {
  const bool delta = GENERATE(false, true);
  INFO((delta ? "delta mode" : "dense mode"));
  Fleet f(2, delta);
  f.WarmUp();

  for (int round = 0; round < 2; ++round) {
    f.cluster->KillAgent("inference-1", SIGKILL);
    // At once (not yet lost by heartbeat) and after the timeout (lost): both commit to replica 0.
    for (int i = 0; i < 2; ++i) {
      f.StepSkipping({1});
      std::this_thread::sleep_for(std::chrono::milliseconds(1800));
    }
    CHECK(f.ReplicaState(1).state() == v1::REPLICA_STATE_LOST);
    CHECK(f.ReplicaState(1).staleness() >= 2);

    REQUIRE(f.cluster->StartAgent("inference-1"));
    REQUIRE(f.replicas[1]->Register(*f.cluster).ok());
    v1::StepResult back = f.StepUntilServing({0, 1});
    CHECK(back.committed_replicas_size() == 2);
    CHECK(f.ReplicaState(1).state() == v1::REPLICA_STATE_SERVING);
    CHECK(f.ReplicaState(1).staleness() == 0);
    // Delta steps again after the catch-up anchor.
    if (delta) f.StepSkipping({});
  }
}

TEST_CASE("a replica's agent SIGKILLed mid-step is dropped from that step; it rejoins") {
  const bool delta = GENERATE(false, true);
  INFO((delta ? "delta mode" : "dense mode"));
  Fleet f(3, delta);
  f.WarmUp();

  // When replica 2's agent begins, freeze it (the sender stalls writing to it), then kill it.
  std::thread killer([&] {
    auto e = f.replicas[2]->Next(v1::Event::KIND_BEGIN, std::chrono::seconds(20));
    if (e.ok()) {
      f.cluster->KillAgent("inference-2", SIGSTOP);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      f.cluster->KillAgent("inference-2", SIGKILL);
    }
  });
  auto r = f.Step();
  killer.join();
  INFO((r.ok() ? "" : Message(r.status())));
  REQUIRE(r.ok());
  CHECK(Fleet::Skipped(*r) == std::set<int>{2});
  CHECK(r->committed_replicas_size() == 2);
  f.VerifyCommitted(*r);

  REQUIRE(f.cluster->StartAgent("inference-2"));
  REQUIRE(f.replicas[2]->Register(*f.cluster).ok());
  f.StepUntilServing({0, 1, 2});
  if (delta) CHECK(f.StepSkipping({}).committed_replicas_size() == 3);
}

TEST_CASE(
    "a replica frozen past the heartbeat timeout is skipped; thawed, it never applies a "
    "delta on the wrong base") {
  const bool delta = GENERATE(false, true);
  INFO((delta ? "delta mode" : "dense mode"));
  Fleet f(2, delta);
  f.WarmUp();

  f.cluster->KillAgent("inference-1", SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));  // past the 1500 ms timeout
  for (int i = 0; i < 2; ++i) {
    f.StepSkipping({1});
  }
  f.cluster->KillAgent("inference-1", SIGCONT);
  // The same agent and worker come back holding an older version: the next step that includes
  // it must be dense for it (the bytes comparison in VerifyCommitted catches a wrong base).
  f.StepUntilServing({0, 1});
  if (delta) f.StepSkipping({});
}

TEST_CASE("a returning replica part way through registering is left out until it is done") {
  Fleet f(2, false);
  f.StepUntilServing({0, 1});
  f.cluster->KillAgent("inference-1", SIGKILL);
  REQUIRE(f.cluster->StartAgent("inference-1"));
  REQUIRE(f.replicas[1]->Register(*f.cluster, /*tensors=*/1).ok());
  // Every rank of replica 1 is back, but only a.weight is: a step now must not commit it (the
  // old code did, with b.weight still holding an older version).
  REQUIRE(wb::testing::WaitUntil(
      [&] {
        auto s = f.ctl->Status();
        if (!s.ok()) return false;
        for (const auto& a : s->agents()) {
          if (a.info().name() == "inference-1") return a.tensors() == 1;
        }
        return false;
      },
      std::chrono::seconds(10)));
  const v1::StepResult partial = f.StepSkipping({1});
  REQUIRE(partial.skipped_replicas_size() == 1);
  CHECK_THAT(partial.skipped_replicas(0).reason(),
             Catch::Contains("still registering: 1 of 2 tensors"));
  // The second tensor arrives on the same session: the next steps reach replica 1 in full.
  TensorInfo b{"b.weight", v1::DTYPE_BF16, {kRows, kCols}, {}};
  REQUIRE(
      f.replicas[1]->session->Register(b, *f.replicas[1]->buffer, kTensorBytes, kTensorBytes).ok());
  f.StepUntilServing({0, 1});
}

TEST_CASE("a brand-new replica added mid-run receives the next step in full") {
  const bool delta = GENERATE(false, true);
  INFO((delta ? "delta mode" : "dense mode"));
  Fleet f(2, delta);
  f.WarmUp();
  REQUIRE(f.cluster->AddAgent("inference-2"));
  f.AddReplica(2);
  v1::StepResult joined = f.StepUntilServing({0, 1, 2});
  CHECK(joined.delta_anchor() == delta);
  CHECK(f.StepSkipping({}).committed_replicas_size() == 3);
}

TEST_CASE("below min_replicas a step fails with a named error; it commits again once back") {
  Fleet f(2, false, /*min_replicas=*/2);
  f.StepUntilServing({0, 1});
  f.cluster->KillAgent("inference-1", SIGKILL);
  auto r = f.Step();
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(Message(r.status()),
             Catch::Contains("below min_replicas (2)") && Catch::Contains("inference-1"));
  REQUIRE(f.cluster->StartAgent("inference-1"));
  REQUIRE(f.replicas[1]->Register(*f.cluster).ok());
  f.StepUntilServing({0, 1});
}

TEST_CASE("wbctl status and /metrics show each replica's committed version, staleness and state") {
  Fleet f(2, false);
  f.StepUntilServing({0, 1});
  const v1::StepResult both = f.StepUntilServing({0, 1});
  const uint64_t v_both = both.version();
  for (int k : {0, 1}) {
    CHECK(f.WbctlRow(k) == std::vector<std::string>{"serving", std::to_string(v_both), "0"});
    CHECK(f.Gauge("weightbeam_replica_committed_version", k) == double(v_both));
    CHECK(f.Gauge("weightbeam_replica_staleness_steps", k) == 0);
  }

  f.cluster->KillAgent("inference-1", SIGKILL);
  std::this_thread::sleep_for(std::chrono::milliseconds(1800));  // past the heartbeat timeout
  for (int i = 0; i < 2; ++i) {
    f.StepSkipping({1});
  }
  CHECK(f.WbctlRow(0) == std::vector<std::string>{"serving", std::to_string(f.version), "0"});
  CHECK(f.WbctlRow(1) == std::vector<std::string>{"lost", std::to_string(v_both), "2"});
  // --json carries the same.
  auto json = wb::testing::Wbctl(
      f.cluster->dir(), {"--controller=" + f.cluster->controller_address(), "--json", "status"});
  REQUIRE(json.code == 0);
  auto st = nlohmann::json::parse(json.text);
  REQUIRE(st["replicas"].size() == 2);
  CHECK(st["replicas"][1]["state"] == "lost");
  CHECK(st["replicas"][1]["committed_version"] == std::to_string(v_both));
  CHECK(f.Gauge("weightbeam_replica_committed_version", 0) == double(f.version));
  CHECK(f.Gauge("weightbeam_replica_staleness_steps", 0) == 0);
  CHECK(f.Gauge("weightbeam_replica_committed_version", 1) == double(v_both));
  CHECK(f.Gauge("weightbeam_replica_staleness_steps", 1) == 2);

  // Back (agent restarted, worker registered again): catching up until the next step.
  REQUIRE(f.cluster->StartAgent("inference-1"));
  REQUIRE(f.replicas[1]->Register(*f.cluster).ok());
  REQUIRE(wb::testing::WaitUntil(
      [&] { return f.ReplicaState(1).state() == v1::REPLICA_STATE_CATCHING_UP; },
      std::chrono::seconds(10)));
  CHECK(f.WbctlRow(1) == std::vector<std::string>{"catching_up", std::to_string(v_both), "2"});
  const v1::StepResult back = f.StepUntilServing({0, 1});
  CHECK(f.WbctlRow(1) == std::vector<std::string>{"serving", std::to_string(back.version()), "0"});
  CHECK(f.Gauge("weightbeam_replica_committed_version", 1) == double(back.version()));
  CHECK(f.Gauge("weightbeam_replica_staleness_steps", 1) == 0);
}

TEST_CASE("max_staleness: a step that would leave a lost replica too far behind fails naming it") {
  Fleet f(2, false);
  const v1::StepResult both = f.StepUntilServing({0, 1});
  f.cluster->KillAgent("inference-1", SIGKILL);
  std::this_thread::sleep_for(std::chrono::milliseconds(1800));  // lost: left out of the plan

  // max_staleness 0: replica 1 would be 1 version behind; the step waits out its deadline and
  // fails without sending anything.
  const auto t0 = Clock::now();
  auto r = f.Step(0u, std::chrono::seconds(3));
  const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  REQUIRE_FALSE(r.ok());
  CHECK(waited > 2.5);
  CHECK_THAT(Message(r.status()), Catch::Contains("max_staleness 0 would be exceeded") &&
                                      Catch::Contains("replica 1 would be 1 version(s) behind") &&
                                      Catch::Contains("inference-1") &&
                                      Catch::Contains("waited until the step deadline"));
  {
    auto st = f.ctl->Status();
    REQUIRE(st.ok());
    CHECK(st->last_committed_version() == both.version());
  }

  // max_staleness 1: one version behind is allowed, so this step commits to replica 0 ...
  auto ok = f.Step(1u);
  INFO((ok.ok() ? "" : Message(ok.status())));
  REQUIRE(ok.ok());
  CHECK(Fleet::Skipped(*ok) == std::set<int>{1});
  f.VerifyCommitted(*ok);
  // ... and the next would make it two: refused, naming replica 1.
  r = f.Step(1u, std::chrono::seconds(2));
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(Message(r.status()), Catch::Contains("max_staleness 1 would be exceeded") &&
                                      Catch::Contains("replica 1 would be 2 version(s) behind"));
  // Without max_staleness training goes on.
  auto plain = f.Step();
  INFO((plain.ok() ? "" : Message(plain.status())));
  REQUIRE(plain.ok());
  CHECK(Fleet::Skipped(*plain) == std::set<int>{1});
  f.VerifyCommitted(*plain);

  // A step that waits on the bound proceeds once the replica returns within its deadline, and
  // reaches it.
  std::string returned = "not yet";
  std::thread back([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    if (!f.cluster->StartAgent("inference-1")) {
      returned = "the agent did not start";
    } else {
      const absl::Status s = f.replicas[1]->Register(*f.cluster);
      returned = s.ok() ? "registered" : Message(s);
    }
  });
  auto waited_ok = f.Step(1u, std::chrono::seconds(15));
  back.join();
  INFO("replica 1's worker: " << returned);
  INFO((waited_ok.ok() ? "" : Message(waited_ok.status())));
  REQUIRE(waited_ok.ok());
  CHECK(waited_ok->committed_replicas_size() == 2);
  f.VerifyCommitted(*waited_ok);
  CHECK(f.ReplicaState(1).staleness() == 0);
}
