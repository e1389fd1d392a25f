// A real wb-agent process and real client processes over its Unix socket: registered tensors
// appear in Describe, bad registrations are refused with a message naming the tensor, and a
// process that is killed has its regions withdrawn.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <set>

#include "client/weightbeam/local_session.h"
#include "client/weightbeam/shared_buffer.h"
#include "tests/support/process.h"
#include "weightbeam/v1/agent.grpc.pb.h"

namespace v1 = weightbeam::v1;
using wb::client::Identity;
using wb::client::LocalSession;
using wb::client::SharedBuffer;
using wb::client::TensorInfo;
using wb::testing::Process;

namespace {

struct AgentUnderTest {
  std::string dir = wb::testing::TempDir("wb-agent-");
  std::string socket = dir + "/agent.sock";
  int port = wb::testing::FreePort();
  std::unique_ptr<Process> proc;
  std::unique_ptr<v1::Agent::Stub> stub;

  AgentUnderTest() {
    proc = std::make_unique<Process>(
        std::vector<std::string>{wb::testing::Runfile("daemon/wb-agent"), "--name", "node-a",
                                 "--socket", socket, "--listen",
                                 "127.0.0.1:" + std::to_string(port), "--controller",
                                 "127.0.0.1:" + std::to_string(wb::testing::FreePort()),
                                 "--tcp-listen", "127.0.0.1:0", "--log-level", "warn"},
        dir + "/agent.log");
    stub = v1::Agent::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                  grpc::InsecureChannelCredentials()));
    REQUIRE(wb::testing::WaitUntil([&] { return access(socket.c_str(), F_OK) == 0; },
                                   std::chrono::seconds(10)));
  }

  v1::AgentLayout Layout() {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::DescribeResponse resp;
    grpc::Status s = stub->Describe(&ctx, v1::DescribeRequest(), &resp);
    REQUIRE(s.ok());
    return resp.layout();
  }
};

TensorInfo Bf16(const std::string& name, std::vector<int64_t> shape,
                std::vector<std::pair<int64_t, int64_t>> shard = {}) {
  return TensorInfo{name, v1::DTYPE_BF16, std::move(shape), std::move(shard)};
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

}  // namespace

// A 64 KiB buffer and an inference rank 0 session on the agent under test.
struct InferenceSide {
  SharedBuffer buffer;
  LocalSession session;
  static InferenceSide Open(const AgentUnderTest& agent, const std::string& name) {
    auto buffer = SharedBuffer::Create(1 << 16, name);
    REQUIRE(buffer.ok());
    auto session = LocalSession::Connect(agent.socket, Identity{v1::ROLE_INFERENCE, 0, 0});
    REQUIRE(session.ok());
    return InferenceSide{std::move(*buffer), std::move(*session)};
  }
};

TEST_CASE("registered tensors appear in Describe and go when their process is killed") {
  AgentUnderTest agent;
  // The registering process is a real child process that holds its session until killed.
  int ready[2];
  REQUIRE(pipe(ready) == 0);
  pid_t child = fork();
  if (child == 0) {
    auto buf = SharedBuffer::Create(4 * 1024 * 2, "w");
    auto session = LocalSession::Connect(agent.socket, Identity{v1::ROLE_TRAINER, 3, 0});
    bool ok = buf.ok() && session.ok() &&
              session
                  ->Register(Bf16("layer.0.weight", {8, 1024}, {{0, 2}, {0, 1024}}), *buf, 0,
                             2 * 1024 * 2)
                  .ok() &&
              session->Register(Bf16("layer.1.weight", {4, 512}), *buf, 4096, 4 * 512 * 2).ok();
    // 'y' and the shared-memory name: SIGKILL leaves the object behind for the parent to remove.
    const std::string reply = (ok ? "y" : "n") + (buf.ok() ? buf->shm_name() : "");
    (void)!write(ready[1], reply.data(), reply.size());
    pause();
    _exit(0);
  }
  char reply[256] = {};
  REQUIRE(read(ready[0], reply, sizeof(reply) - 1) >= 1);
  REQUIRE(reply[0] == 'y');
  const std::string child_shm = reply + 1;

  v1::AgentLayout layout = agent.Layout();
  REQUIRE(layout.tensors_size() == 2);
  std::map<std::string, v1::TensorLayout> by_name;
  for (const auto& t : layout.tensors()) by_name[t.spec().name()] = t;
  const auto& l0 = by_name.at("layer.0.weight");
  CHECK(l0.owner().role() == v1::ROLE_TRAINER);
  CHECK(l0.owner().rank() == 3);
  CHECK(l0.owner().pid() == child);
  CHECK(l0.region().length() == 2 * 1024 * 2);
  CHECK(l0.location() == "host");
  CHECK(l0.spec().shard(0).size() == 2);
  // Registered with every enabled transport: each contributes keys.
  std::set<std::string> transports;
  for (const auto& k : l0.region().keys()) transports.insert(k.transport());
  CHECK(transports.count("tcp") == 1);
  CHECK(transports.count("local") == 1);

  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  CHECK(wb::testing::WaitUntil([&] { return agent.Layout().tensors_size() == 0; },
                               std::chrono::seconds(10)));
  shm_unlink(child_shm.c_str());
}

TEST_CASE("bad registrations are refused with the tensor named; the agent keeps serving") {
  AgentUnderTest agent;
  InferenceSide side = InferenceSide::Open(agent, "bad");
  SharedBuffer* buf = &side.buffer;
  LocalSession* session = &side.session;

  SECTION("shape inconsistent with the byte length") {
    auto s = session->Register(Bf16("w.shape", {16, 16}), *buf, 0, 100);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(Message(s), Catch::Contains("tensor 'w.shape'") &&
                               Catch::Contains("needs 512 bytes but the memory handle covers 100"));
  }
  SECTION("unknown dtype") {
    TensorInfo t = Bf16("w.dtype", {4});
    t.dtype = static_cast<v1::DType>(42);
    auto s = session->Register(t, *buf, 0, 8);
    CHECK_THAT(Message(s), Catch::Contains("tensor 'w.dtype': unknown dtype 42"));
  }
  SECTION("shard outside the global shape") {
    auto s = session->Register(Bf16("w.shard", {8, 8}, {{6, 4}, {0, 8}}), *buf, 0, 64);
    CHECK_THAT(Message(s), Catch::Contains("tensor 'w.shard': shard slice [6, 10) of dimension "
                                           "0 is outside the global extent 8"));
  }
  SECTION("negative dimension") {
    auto s = session->Register(Bf16("w.neg", {-3, 8}), *buf, 0, 48);
    CHECK_THAT(Message(s), Catch::Contains("dimension 0 of the global shape is -3"));
  }
  SECTION("shared memory too small") {
    auto s = session->Register(Bf16("w.small", {64, 1024}), *buf, 0, 64 * 1024 * 2);
    CHECK_THAT(Message(s), Catch::Contains("tensor 'w.small'") && Catch::Contains("too small"));
  }
  SECTION("duplicate registration, also from another process claiming the same rank") {
    REQUIRE(session->Register(Bf16("w.dup", {8, 8}), *buf, 0, 128).ok());
    auto again = session->Register(Bf16("w.dup", {8, 8}), *buf, 0, 128);
    CHECK(again.code() == absl::StatusCode::kAlreadyExists);
    CHECK_THAT(Message(again), Catch::Contains("tensor 'w.dup' is already registered by "
                                               "inference replica 0 rank 0"));
    pid_t child = fork();
    if (child == 0) {
      auto other = LocalSession::Connect(agent.socket, Identity{v1::ROLE_INFERENCE, 0, 0});
      auto s = other->Register(Bf16("w.dup", {8, 8}), *buf, 0, 128);
      _exit(s.code() == absl::StatusCode::kAlreadyExists &&
                    std::string(s.message()).find("already registered") != std::string::npos
                ? 0
                : 1);
    }
    int st = 0;
    waitpid(child, &st, 0);
    CHECK(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 0);
  }
  SECTION("another rank of the replica may hold a copy of a replicated tensor") {
    REQUIRE(session->Register(Bf16("w.norm", {8}), *buf, 0, 16).ok());
    pid_t child = fork();
    if (child == 0) {
      auto other = LocalSession::Connect(agent.socket, Identity{v1::ROLE_INFERENCE, 1, 0});
      _exit(other->Register(Bf16("w.norm", {8}), *buf, 0, 16).ok() ? 0 : 1);
    }
    int st = 0;
    waitpid(child, &st, 0);
    CHECK(WEXITSTATUS(st) == 0);
  }
  SECTION("GPU memory CUDA IPC cannot export (no device here; a null pointer anywhere)") {
    // Refused by the client library before a request is sent, naming the tensor.
    auto s = session->RegisterCuda(Bf16("w.gpu", {4}), nullptr, 8, 0);
    CHECK_FALSE(s.ok());
    CHECK_THAT(Message(s), Catch::Contains("tensor 'w.gpu': CUDA IPC: "));
  }
  // After any refusal the agent still serves: a good registration works.
  REQUIRE(session->Register(Bf16("w.good", {4, 4}), *buf, 1024, 32).ok());
  bool found = false;
  const v1::AgentLayout after = agent.Layout();
  for (const auto& t : after.tensors()) found |= t.spec().name() == "w.good";
  CHECK(found);
}

TEST_CASE("parts of one buffer share its memory; overlaps and bad views are refused") {
  AgentUnderTest agent;
  InferenceSide side = InferenceSide::Open(agent, "view");
  SharedBuffer* buf = &side.buffer;
  LocalSession* session = &side.session;
  // qkv [12, 8] bf16 = 192 bytes: q rows 0..8, k rows 8..10, v rows 10..12.
  auto part = [](const std::string& name, int64_t rows, int64_t start, int64_t at) {
    TensorInfo t = Bf16(name, {8, 8}, {{start, rows}, {0, 8}});
    t.view_shape = {12, 8};
    t.view_offset = {at, 0};
    t.view_buffer = "qkv_proj.weight";
    return t;
  };
  REQUIRE(session->Register(part("q.weight", 8, 0, 0), *buf, 0, 192).ok());
  REQUIRE(session->Register(part("k.weight", 2, 4, 8), *buf, 0, 192).ok());
  int parts = 0;
  const v1::AgentLayout layout = agent.Layout();
  for (const auto& t : layout.tensors()) {
    if (!t.spec().has_view()) continue;
    ++parts;
    CHECK(t.spec().view().buffer() == "qkv_proj.weight");
    CHECK(t.region().length() == 192);
  }
  CHECK(parts == 2);

  SECTION("a part overlapping another inside the buffer") {
    auto s = session->Register(part("v.weight", 2, 0, 9), *buf, 0, 192);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(Message(s), Catch::Contains("tensor 'v.weight'") &&
                               Catch::Contains("overlaps part 'k.weight'") &&
                               Catch::Contains("buffer 'qkv_proj.weight'"));
  }
  SECTION("a part sticking out of the buffer") {
    auto s = session->Register(part("v.weight", 2, 0, 11), *buf, 0, 192);
    CHECK_THAT(Message(s), Catch::Contains("tensor 'v.weight' (part of buffer 'qkv_proj.weight'") &&
                               Catch::Contains("spans [11, 11 + 2) of buffer dimension 0"));
  }
  SECTION("memory that is not the whole buffer") {
    auto s = session->Register(part("v.weight", 2, 0, 10), *buf, 256, 32);
    CHECK_THAT(Message(s), Catch::Contains("needs 192 bytes but the memory handle covers 32"));
  }
  SECTION("a view with more shard dims than buffer dims") {
    TensorInfo t = part("v.weight", 2, 0, 10);
    t.view_shape = {96};
    t.view_offset = {0};
    CHECK_THAT(Message(session->Register(t, *buf, 0, 192)),
               Catch::Contains("the shard has 2 dimensions, more than the buffer's 1"));
  }
  // The last part fits exactly.
  CHECK(session->Register(part("v.weight", 2, 6, 10), *buf, 0, 192).ok());
}

TEST_CASE("two destination tensors over the same bytes are refused, naming both") {
  AgentUnderTest agent;
  InferenceSide side = InferenceSide::Open(agent, "alias");
  SharedBuffer* buf = &side.buffer;
  LocalSession* session = &side.session;
  // w.a: bytes [0, 2048) of the buffer.
  REQUIRE(session->Register(Bf16("w.a", {32, 32}), *buf, 0, 2048).ok());

  SECTION("a second tensor over part of the first one's bytes") {
    auto s = session->Register(Bf16("w.b", {32, 32}), *buf, 1024, 2048);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(Message(s), Catch::Contains("tensor 'w.b'") && Catch::Contains("'w.a'") &&
                               Catch::Contains("[1024, 3072)") && Catch::Contains("[0, 2048)"));
  }
  SECTION("a tensor inside the first one's bytes, registered in a batch") {
    auto s = session->RegisterBatch({{Bf16("w.c", {4}), 8, 8}}, *buf);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(Message(s), Catch::Contains("tensor 'w.c'") && Catch::Contains("'w.a'"));
  }
  SECTION("another worker's destination over the same bytes") {
    auto other = LocalSession::Connect(agent.socket, Identity{v1::ROLE_INFERENCE, 0, 1});
    REQUIRE(other.ok());
    auto s = other->Register(Bf16("w.d", {32, 32}), *buf, 0, 2048);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(Message(s), Catch::Contains("tensor 'w.d'") && Catch::Contains("'w.a'"));
  }
  // Refusals leave nothing behind; a neighbour that only touches the first one's end is fine,
  // and trainer sources may share bytes (they are only read).
  CHECK(session->Register(Bf16("w.e", {32, 32}), *buf, 2048, 2048).ok());
  auto trainer = LocalSession::Connect(agent.socket, Identity{v1::ROLE_TRAINER, 0, 0});
  REQUIRE(trainer.ok());
  auto src = SharedBuffer::Create(4096, "alias-src");
  REQUIRE(src.ok());
  CHECK(trainer->Register(Bf16("w.a", {32, 32}), *src, 0, 2048).ok());
  CHECK(trainer->Register(Bf16("w.e", {32, 32}), *src, 1024, 2048).ok());
  int tensors = 0;
  const v1::AgentLayout layout = agent.Layout();
  for (const auto& t : layout.tensors()) tensors += t.owner().role() == v1::ROLE_INFERENCE;
  CHECK(tensors == 2);
}

TEST_CASE("a second agent on the same socket is refused clearly") {
  AgentUnderTest agent;
  std::string log = agent.dir + "/second.log";
  Process second({wb::testing::Runfile("daemon/wb-agent"), "--name", "node-b", "--socket",
                  agent.socket, "--listen", "127.0.0.1:0", "--tcp-listen", "127.0.0.1:0"},
                 log);
  CHECK(second.Wait(std::chrono::seconds(10)) == 1);
  CHECK_THAT(wb::testing::ReadFile(log),
             Catch::Contains("another wb-agent is already serving " + agent.socket));
  // The first agent is unharmed.
  CHECK(agent.Layout().agent() == "node-a");
}

// Pipelined registration (RegisterBatches): several batches on their way at once. A refusal in
// the middle batch names its batch and tensor; the batches before it stay registered, the
// refused one leaves nothing, and each later batch is either registered or reported as not
// sent: the outcomes say which, and the agent's layout agrees with them exactly.
TEST_CASE("pipelined batches: a bad tensor in the middle batch is named, nothing else is lost") {
  AgentUnderTest agent;
  auto side = InferenceSide::Open(agent, "pipelined");
  // 5 batches of 100 destinations, 4 bytes each, one after another in the buffer.
  std::vector<std::vector<wb::client::BufferSlice>> batches(5);
  for (int b = 0; b < 5; ++b) {
    for (int k = 0; k < 100; ++k) {
      const int i = b * 100 + k;
      batches[b].push_back({Bf16("p." + std::to_string(i), {2}), 4ull * i, 4});
    }
  }
  auto names_in_layout = [&] {
    std::set<std::string> names;
    const v1::AgentLayout layout = agent.Layout();
    for (const auto& t : layout.tensors()) names.insert(t.spec().name());
    return names;
  };

  SECTION("all batches registered, in a window wider than the batch count") {
    std::vector<absl::Status> outcomes;
    REQUIRE(side.session.RegisterBatches(batches, side.buffer, 8, &outcomes).ok());
    REQUIRE(outcomes.size() == 5);
    for (const auto& o : outcomes) CHECK(o.ok());
    CHECK(names_in_layout().size() == 500);
  }
  SECTION("a shape that does not fit its bytes, in the middle batch") {
    batches[2][50].tensor.global_shape = {3};  // 6 bytes of BF16 in a 4-byte slice
    std::vector<absl::Status> outcomes;
    auto s = side.session.RegisterBatches(batches, side.buffer, 3, &outcomes);
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(Message(s), Catch::Contains("batch 2 of 5") && Catch::Contains("'p.250'"));
    REQUIRE(outcomes.size() == 5);
    CHECK(outcomes[0].ok());
    CHECK(outcomes[1].ok());
    CHECK(outcomes[2].code() == s.code());
    const std::set<std::string> names = names_in_layout();
    size_t expected = 0;
    for (int b = 0; b < 5; ++b) {
      // Later batches: registered, or never sent (CANCELLED); never half of one.
      if (b > 2) CHECK((outcomes[b].ok() || outcomes[b].code() == absl::StatusCode::kCancelled));
      for (const auto& t : batches[b]) {
        CHECK(names.count(t.tensor.name) == (outcomes[b].ok() ? 1u : 0u));
      }
      if (outcomes[b].ok()) expected += batches[b].size();
    }
    CHECK(names.size() == expected);
    // The session goes on: the fixed batch and the unsent ones register afterwards.
    batches[2][50].tensor.global_shape = {2};
    std::vector<std::vector<wb::client::BufferSlice>> rest;
    for (int b = 2; b < 5; ++b) {
      if (!outcomes[b].ok()) rest.push_back(batches[b]);
    }
    CHECK(side.session.RegisterBatches(rest, side.buffer, 2).ok());
    CHECK(names_in_layout().size() == 500);
  }
  SECTION("a name registered by an earlier batch of the same call") {
    batches[3][7].tensor.name = "p.7";
    std::vector<absl::Status> outcomes;
    auto s = side.session.RegisterBatches(batches, side.buffer, 1, &outcomes);
    CHECK(s.code() == absl::StatusCode::kAlreadyExists);
    CHECK_THAT(Message(s), Catch::Contains("batch 3 of 5") && Catch::Contains("'p.7'"));
    // One in flight: batches after the refused one are never sent.
    CHECK(outcomes[4].code() == absl::StatusCode::kCancelled);
    CHECK(names_in_layout().size() == 300);
  }
  SECTION("an invalid name anywhere: nothing is sent") {
    batches[4][99].tensor.name = std::string("bad\xff", 4);
    auto s = side.session.RegisterBatches(batches, side.buffer, 4);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(names_in_layout().empty());
  }
}

// Within one request the agent checks a shared-memory object once (its first tensor) and takes
// the request's later tensors as ranges of it; a range past its end is still refused, and the
// next request checks the object again (here: replaced under its name by a smaller one).
TEST_CASE("each request checks its memory object again; a range past its end is refused") {
  AgentUnderTest agent;
  auto side = InferenceSide::Open(agent, "recheck");  // 64 KiB
  const std::string name = side.buffer.shm_name();
  auto s = side.session.RegisterBatch(
      {{Bf16("r.0", {2}), 0, 4}, {Bf16("r.1", {2}), 4, 4}, {Bf16("r.far", {2}), 1 << 16, 4}},
      side.buffer);
  CHECK(s.code() == absl::StatusCode::kOutOfRange);
  CHECK_THAT(Message(s), Catch::Contains("tensor 'r.far'"));
  CHECK(agent.Layout().tensors_size() == 0);
  REQUIRE(shm_unlink(name.c_str()) == 0);
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, 4096) == 0);
  close(fd);
  s = side.session.RegisterBatch({{Bf16("r.2", {2}), 0, 4}, {Bf16("r.3", {2}), 8192, 4}},
                                 side.buffer);
  CHECK(s.code() == absl::StatusCode::kOutOfRange);
  CHECK_THAT(Message(s), Catch::Contains("tensor 'r.3'"));
  CHECK(
      side.session.RegisterBatch({{Bf16("r.4", {2}), 0, 4}, {Bf16("r.5", {2}), 4, 4}}, side.buffer)
          .ok());
  CHECK(agent.Layout().tensors_size() == 2);
}

TEST_CASE("a refused batch undoes exactly its own registrations, not a same-named part") {
  // Issue 41, item 11: the undo withdrew by name, so a refused batch holding a part of
  // 'w.weight' removed the part an earlier batch had registered under that name.
  AgentUnderTest agent;
  InferenceSide side = InferenceSide::Open(agent, "undo");
  // 'w.weight' [8, 8] bf16 in two parts, rows 0..4 in buffer 'first', rows 4..8 in 'second'
  // (two 64-byte views of a [4, 8] buffer each).
  auto part = [](int64_t start, const std::string& buffer) {
    TensorInfo t = Bf16("w.weight", {8, 8}, {{start, 4}, {0, 8}});
    t.view_shape = {4, 8};
    t.view_offset = {0, 0};
    t.view_buffer = buffer;
    return t;
  };
  REQUIRE(side.session.RegisterBatch({{part(0, "first"), 0, 64}}, side.buffer).ok());
  // The second batch: the other part, then a tensor that is refused (no such dtype size).
  const absl::Status refused = side.session.RegisterBatch(
      {{part(4, "second"), 1024, 64}, {Bf16("bad.weight", {8, 8}), 2048, 3}}, side.buffer);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(Message(refused), Catch::Contains("bad.weight"));
  // Left: exactly the first batch's part (rows 0..4), none of the refused batch's.
  int parts = 0;
  const v1::AgentLayout layout = agent.Layout();
  for (const auto& t : layout.tensors()) {
    if (t.spec().name() != "w.weight") continue;
    ++parts;
    CHECK(t.spec().view().buffer() == "first");
  }
  CHECK(parts == 1);
}
