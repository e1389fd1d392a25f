// Checked arithmetic where sizes come from outside (issue 14, class 3), against real processes:
// a registration whose byte count overflows 64 bits, a layout reaching the controller with such
// a tensor, and a plan op that reads past the sending agent's own region.
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>

#include "client/weightbeam/local_session.h"
#include "client/weightbeam/shared_buffer.h"
#include "tests/support/cluster.h"
#include "tests/support/grpc_call.h"
#include "weightbeam/v1/agent.grpc.pb.h"
#include "weightbeam/v1/controller.grpc.pb.h"

namespace v1 = weightbeam::v1;
using namespace wb::client;
using wb::testing::Cluster;

namespace {

std::string Message(const absl::Status& s) { return std::string(s.message()); }

// A 4 KiB buffer and a session of trainer rank 0 on the trainer agent.
struct TrainerSide {
  SharedBuffer buffer;
  LocalSession session;
};

TrainerSide OpenTrainer(const Cluster& cluster, const std::string& buffer_name) {
  auto buffer = SharedBuffer::Create(4096, buffer_name);
  REQUIRE(buffer.ok());
  auto session = LocalSession::Connect(cluster.socket("trainer-node"), {v1::ROLE_TRAINER, 0, 0});
  INFO((session.ok() ? "" : Message(session.status())));
  REQUIRE(session.ok());
  return TrainerSide{std::move(*buffer), std::move(*session)};
}

}  // namespace

TEST_CASE("a registration whose byte count overflows 64 bits is refused", "[security]") {
  Cluster cluster(wb::testing::Runfile(""), {});
  auto [buffer, session] = OpenTrainer(cluster, "overflow");
  // 2^61 + 1 i64 elements need 2^64 + 8 bytes: wrapped, that is the 8 bytes registered.
  TensorInfo t{"huge.weight", v1::DTYPE_I64, {(int64_t{1} << 61) + 1}, {}};
  absl::Status s = session.Register(t, buffer, 0, 8);
  INFO(Message(s));
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(Message(s), Catch::Contains("huge.weight") && Catch::Contains("2^64"));
  // The agent keeps serving: a proper tensor still registers.
  TensorInfo ok{"small.weight", v1::DTYPE_I64, {512}, {}};
  CHECK(session.Register(ok, buffer, 0, 4096).ok());
}

TEST_CASE("the controller refuses a layout whose sizes overflow", "[security]") {
  Cluster cluster(wb::testing::Runfile(""), {});
  auto channel =
      grpc::CreateChannel(cluster.controller_address(), grpc::InsecureChannelCredentials());
  auto stub = v1::Controller::NewStub(channel);
  v1::RegisterAgentRequest req;
  req.mutable_agent()->set_name("forger");
  req.mutable_agent()->set_control_endpoint("127.0.0.1:1");
  auto* t = req.mutable_layout()->add_tensors();
  t->mutable_spec()->set_name("huge.weight");
  t->mutable_spec()->set_dtype(v1::DTYPE_I64);
  t->mutable_spec()->add_global_shape((int64_t{1} << 61) + 1);
  t->mutable_region()->set_length(8);
  t->mutable_owner()->set_role(v1::ROLE_TRAINER);
  v1::RegisterAgentResponse resp;
  grpc::Status st = wb::testing::CallWithin(std::chrono::seconds(20), stub.get(),
                                            &v1::Controller::Stub::RegisterAgent, req, &resp);
  INFO(st.error_message());
  REQUIRE(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(st.error_message(), Catch::Contains("forger") && Catch::Contains("huge.weight"));
}

TEST_CASE("an agent refuses a plan op that reads past its own region", "[security]") {
  Cluster cluster(wb::testing::Runfile(""), {});
  auto [buffer, session] = OpenTrainer(cluster, "src");
  REQUIRE(session.Register({"w", v1::DTYPE_BF16, {2048}, {}}, buffer, 0, 4096).ok());

  auto stub = v1::Agent::NewStub(grpc::CreateChannel(cluster.agent_address("trainer-node"),
                                                     grpc::InsecureChannelCredentials()));
  uint64_t region = 0;
  {
    grpc::ClientContext ctx;
    v1::DescribeRequest req;
    v1::DescribeResponse resp;
    REQUIRE(stub->Describe(&ctx, req, &resp).ok());
    REQUIRE(resp.layout().tensors_size() == 1);
    region = resp.layout().tensors(0).region().region_id();
  }
  auto load = [&](v1::TransferOp op) {
    v1::LoadPlanRequest req;
    req.mutable_plan()->set_plan_id(77);
    op.set_op_id(1);
    op.set_src_tensor("w");
    op.set_dst_tensor("w");
    op.set_dst_agent("nobody");
    op.set_src_region(region);
    op.set_src_dtype(v1::DTYPE_BF16);
    op.set_dst_dtype(v1::DTYPE_BF16);
    *req.mutable_plan()->add_ops() = op;
    v1::LoadPlanResponse resp;
    return wb::testing::CallWithin(std::chrono::seconds(20), stub.get(), &v1::Agent::Stub::LoadPlan,
                                   req, &resp);
  };
  v1::TransferOp past_end;  // 1 MiB read from a 4 KiB region
  past_end.set_rows(1);
  past_end.set_row_elems(1 << 19);
  grpc::Status st = load(past_end);
  INFO(st.error_message());
  CHECK_FALSE(st.ok());
  CHECK_THAT(st.error_message(), Catch::Contains("source region of 4096 bytes"));

  v1::TransferOp wraps;  // rows * stride wraps around 2^64 back into the region
  wraps.set_rows(3);
  wraps.set_row_elems(8);
  wraps.set_src_stride(uint64_t{1} << 63);
  st = load(wraps);
  INFO(st.error_message());
  CHECK_FALSE(st.ok());
  CHECK(cluster.agent("trainer-node")->running());
}
