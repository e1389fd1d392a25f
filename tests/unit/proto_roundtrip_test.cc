// Wire contracts: messages that carry numbers at the edges survive a serialize/parse round trip.
#include <catch2/catch.hpp>
#include <cstdint>
#include <limits>

#include "weightbeam/v1/agent.pb.h"
#include "weightbeam/v1/controller.pb.h"
#include "weightbeam/v1/local.pb.h"
#include "weightbeam/v1/transport.pb.h"
#include "weightbeam/v1/types.pb.h"

namespace v1 = weightbeam::v1;

template <typename M>
M RoundTrip(const M& in) {
  std::string bytes;
  REQUIRE(in.SerializeToString(&bytes));
  M out;
  REQUIRE(out.ParseFromString(bytes));
  return out;
}

TEST_CASE("tensor spec: empty and 8-dim shapes with 64-bit extents") {
  v1::TensorSpec empty;
  empty.set_name("scalar");
  empty.set_dtype(v1::DTYPE_F32);
  auto e = RoundTrip(empty);
  CHECK(e.global_shape_size() == 0);
  CHECK(e.name() == "scalar");

  v1::TensorSpec big;
  big.set_name("model.layers.60.mlp.experts.383.down_proj.weight");
  big.set_dtype(v1::DTYPE_BF16);
  for (int d = 0; d < 8; ++d) {
    big.add_global_shape(std::numeric_limits<int64_t>::max() - d);
    auto* s = big.add_shard();
    s->set_start(int64_t{1} << 40);
    s->set_size((int64_t{1} << 41) + d);
  }
  auto b = RoundTrip(big);
  REQUIRE(b.global_shape_size() == 8);
  CHECK(b.global_shape(7) == std::numeric_limits<int64_t>::max() - 7);
  CHECK(b.shard(3).start() == int64_t{1} << 40);
  CHECK(b.shard(7).size() == (int64_t{1} << 41) + 7);
}

TEST_CASE("memory handles and region descriptors keep 64-bit addresses and keys") {
  v1::MemoryHandle h;
  h.mutable_cuda_ipc()->set_ipc_handle(std::string(64, '\xff'));
  h.mutable_cuda_ipc()->set_offset(std::numeric_limits<uint64_t>::max());
  auto hh = RoundTrip(h);
  REQUIRE(hh.has_cuda_ipc());
  CHECK(hh.cuda_ipc().ipc_handle().size() == 64);
  CHECK(hh.cuda_ipc().offset() == std::numeric_limits<uint64_t>::max());

  v1::RegionDescriptor r;
  r.set_region_id(0xfedcba9876543210ull);
  r.set_length(uint64_t{1} << 63);
  auto* k = r.add_keys();
  k->set_transport("rdma");
  k->set_device("mlx5_1");
  k->set_address(0x7fffffffffffull);
  k->set_key(0xffffffffffffffffull);
  auto rr = RoundTrip(r);
  CHECK(rr.region_id() == 0xfedcba9876543210ull);
  CHECK(rr.length() == uint64_t{1} << 63);
  CHECK(rr.keys(0).address() == 0x7fffffffffffull);
  CHECK(rr.keys(0).key() == 0xffffffffffffffffull);
}

TEST_CASE("plans, step results and events round trip") {
  v1::AgentPlan plan;
  plan.set_plan_id(std::numeric_limits<uint64_t>::max());
  auto* op = plan.add_ops();
  op->set_src_offset(uint64_t{1} << 50);
  op->set_dst_stride(std::numeric_limits<uint64_t>::max());
  op->set_transform(v1::TRANSFORM_FP8_BLOCK);
  op->set_phase(-1);
  auto p = RoundTrip(plan);
  CHECK(p.plan_id() == std::numeric_limits<uint64_t>::max());
  CHECK(p.ops(0).src_offset() == uint64_t{1} << 50);
  CHECK(p.ops(0).transform() == v1::TRANSFORM_FP8_BLOCK);
  CHECK(p.ops(0).phase() == -1);

  v1::StepResult s;
  s.set_version(std::numeric_limits<uint64_t>::max());
  s.set_seconds(1e-9);
  s.add_agents()->mutable_stages()->set_peak_staging_bytes(uint64_t{1} << 62);
  auto ss = RoundTrip(s);
  CHECK(ss.version() == std::numeric_limits<uint64_t>::max());
  CHECK(ss.seconds() == 1e-9);
  CHECK(ss.agents(0).stages().peak_staging_bytes() == uint64_t{1} << 62);

  v1::Event ev;
  ev.set_kind(v1::Event::KIND_ABORT);
  ev.set_version(0);
  ev.set_reason("agent trainer-0 lost");
  auto ee = RoundTrip(ev);
  CHECK(ee.kind() == v1::Event::KIND_ABORT);
  CHECK(ee.reason() == "agent trainer-0 lost");
}

TEST_CASE("session requests and rdma records round trip") {
  v1::SessionRequest req;
  req.set_request_id(std::numeric_limits<uint64_t>::max());
  auto* t = req.mutable_register_()->add_tensors();
  t->mutable_spec()->set_name("w");
  t->mutable_memory()->mutable_host_shm()->set_length(uint64_t{1} << 40);
  auto r = RoundTrip(req);
  REQUIRE(r.has_register_());
  CHECK(r.register_().tensors(0).memory().host_shm().length() == uint64_t{1} << 40);

  v1::RdmaQpRecord qp;
  qp.set_gid(std::string(16, '\0'));
  qp.set_qpn(0xffffff);
  qp.set_psn(0xffffff);
  auto q = RoundTrip(qp);
  CHECK(q.gid().size() == 16);
  CHECK(q.qpn() == 0xffffff);
}
