// Layout requests on the agent's Unix socket (issue 31, item 3) with a real wb-agent process: a
// local client's config.json asking for 2^62 layers, 2^40 experts or a 2^62-entry vocabulary
// is refused at once, naming the field and the limit (engines::kMaxConfigSize,
// engines::kMaxConfigTensors), by EngineLayout and SourceLayout alike; the agent keeps
// answering. The test process (and so the agent it starts) runs under an 8 GiB address-space
// limit: a build without the limit then fails the call instead of exhausting the machine.
#include <grpcpp/grpcpp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <functional>
#include <string>

#include "tests/support/process.h"
#include "weightbeam/v1/local.grpc.pb.h"

namespace v1 = weightbeam::v1;
using wb::testing::Process;

namespace {

// A Qwen3-MoE config.json with `field` set to `value` (a JSON number).
std::string MoeConfig(const std::string& field = "", const std::string& value = "") {
  std::string fields[][2] = {
      {"hidden_size", "256"},     {"intermediate_size", "512"}, {"moe_intermediate_size", "1024"},
      {"num_hidden_layers", "2"}, {"num_attention_heads", "8"}, {"num_key_value_heads", "2"},
      {"head_dim", "128"},        {"num_experts", "8"},         {"vocab_size", "777"}};
  std::string json =
      "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\", "
      "\"decoder_sparse_step\": 1";
  for (auto& [k, v] : fields) {
    json += ", \"" + k + "\": " + (k == field ? value : v);
  }
  return json + "}";
}

struct Agent {
  std::string dir = wb::testing::TempDir("wb-layout-");
  std::string socket = dir + "/agent.sock";
  std::unique_ptr<Process> proc;
  std::unique_ptr<v1::Local::Stub> local;

  Agent() {
    proc = std::make_unique<Process>(
        std::vector<std::string>{
            wb::testing::Runfile("daemon/wb-agent"), "--name", "node-a", "--socket", socket,
            "--listen", "127.0.0.1:" + std::to_string(wb::testing::FreePort()), "--controller",
            "127.0.0.1:" + std::to_string(wb::testing::FreePort()), "--tcp-listen", "127.0.0.1:0",
            "--log-level", "warn"},
        dir + "/agent.log");
    REQUIRE(wb::testing::WaitUntil([&] { return access(socket.c_str(), F_OK) == 0; },
                                   std::chrono::seconds(10)));
    local = v1::Local::NewStub(
        grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
  }

  grpc::Status Engine(const std::string& config, v1::EngineLayoutResponse* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::EngineLayoutRequest req;
    req.set_config_json(config);
    req.set_engine("vllm");
    req.set_tp(1);
    return local->EngineLayout(&ctx, req, resp);
  }
  grpc::Status Source(const std::string& config, v1::SourceLayoutResponse* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::SourceLayoutRequest req;
    req.set_config_json(config);
    req.set_world(1);
    return local->SourceLayout(&ctx, req, resp);
  }
};

}  // namespace

TEST_CASE("layout requests beyond the config limits are refused naming the limit", "[security]") {
  rlimit as{uint64_t{8} << 30, uint64_t{8} << 30};
  REQUIRE(setrlimit(RLIMIT_AS, &as) == 0);
  Agent agent;
  const std::pair<std::string, std::string> cases[] = {
      {"num_hidden_layers", "4611686018427387904"},  // 2^62
      {"num_experts", "1099511627776"},              // 2^40
      {"vocab_size", "4611686018427387904"},
      {"num_hidden_layers", "1000000"},  // each size fine; the tensors they make are not
  };
  for (const auto& [field, value] : cases) {
    INFO(field << " = " << value);
    const std::string config = MoeConfig(field, value);
    v1::EngineLayoutResponse engine;
    grpc::Status s = agent.Engine(config, &engine);
    INFO(s.error_message());
    REQUIRE(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK_THAT(s.error_message(), Catch::Contains(field) && Catch::Contains("limit"));
    v1::SourceLayoutResponse source;
    s = agent.Source(config, &source);
    INFO(s.error_message());
    CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK_THAT(s.error_message(), Catch::Contains(field) && Catch::Contains("limit"));
    REQUIRE(agent.proc->running());
  }
  // The agent still answers, and a model within the limits gets its layout.
  v1::EngineLayoutResponse engine;
  REQUIRE(agent.Engine(MoeConfig(), &engine).ok());
  CHECK(engine.params_size() > 0);
  v1::SourceLayoutResponse source;
  REQUIRE(agent.Source(MoeConfig(), &source).ok());
  CHECK(source.tensors_size() > 0);
}

TEST_CASE("trainer layout requests with parallel settings past their limits are refused",
          "[security]") {
  // Issue 41, item 7: make_vocab_size_divisible_by 2^62 x tp 4 wrapped to 0 and the agent died
  // of SIGFPE dividing the vocab by it.
  Agent agent;
  struct Case {
    const char* what;
    std::function<void(v1::TrainerLayoutRequest*)> set;
    const char* named;
  };
  const Case cases[] = {
      {"vocab_divisible_by 2^62, tp 4",
       [](v1::TrainerLayoutRequest* r) {
         r->mutable_megatron()->set_vocab_divisible_by(int64_t{1} << 62);
         r->mutable_megatron()->set_tp(4);
       },
       "make_vocab_size_divisible_by"},
      {"vocab_divisible_by -1",
       [](v1::TrainerLayoutRequest* r) { r->mutable_megatron()->set_vocab_divisible_by(-1); },
       "make_vocab_size_divisible_by"},
      {"tp 2^31-1", [](v1::TrainerLayoutRequest* r) { r->mutable_megatron()->set_tp(2147483647); },
       "tp"},
      {"pp -5", [](v1::TrainerLayoutRequest* r) { r->mutable_megatron()->set_pp(-5); }, "pp"},
      {"etp_rank past etp",
       [](v1::TrainerLayoutRequest* r) { r->mutable_megatron()->set_etp_rank(7); }, "etp_rank"},
      {"a 2^31-1 mesh",
       [](v1::TrainerLayoutRequest* r) {
         r->mutable_dtensor()->add_mesh(2147483647);
         r->mutable_dtensor()->add_coords(0);
       },
       "mesh"},
      {"a 5000-character pattern",
       [](v1::TrainerLayoutRequest* r) {
         r->mutable_dtensor()->add_mesh(1);
         r->mutable_dtensor()->add_coords(0);
         auto* rule = r->mutable_dtensor()->add_rules();
         rule->set_pattern(std::string(5000, '*'));
         rule->set_placements("R");
       },
       "pattern"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    v1::TrainerLayoutRequest req;
    // Four query groups: tp 4 divides them, so the vocab padding is reached.
    req.set_config_json(MoeConfig("num_key_value_heads", "4"));
    c.set(&req);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::TrainerLayoutResponse resp;
    grpc::Status s = agent.local->TrainerLayout(&ctx, req, &resp);
    INFO(s.error_message());
    CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK_THAT(s.error_message(), Catch::Contains(c.named));
    REQUIRE(agent.proc->running());
  }
  // Still answering, and settings within the limits get their layout.
  v1::TrainerLayoutRequest req;
  req.set_config_json(MoeConfig());
  req.mutable_megatron()->set_tp(2);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::TrainerLayoutResponse resp;
  REQUIRE(agent.local->TrainerLayout(&ctx, req, &resp).ok());
  CHECK(resp.tensors_size() > 0);
}
