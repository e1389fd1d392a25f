// No SIGBUS (issue 14, class 2) with real processes: a local process that shrinks (ftruncate)
// its registered shared-memory object must not kill the agent. The step that would read or
// write past the new end fails naming the tensor and its owner; the agent lives on.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "client/weightbeam/controller_client.h"
#include "client/weightbeam/shared_buffer.h"
#include "daemon/registry/bus_guard.h"
#include "tests/support/cluster.h"
#include "tests/support/one_tensor.h"

namespace v1 = weightbeam::v1;
using namespace wb::client;
using wb::testing::Cluster;

namespace {

void Shrink(const SharedBuffer& buf) {
  int fd = shm_open(buf.shm_name().c_str(), O_RDWR, 0);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, 0) == 0);
  close(fd);
}

// Tensor "w", 512 x 1024, registered on the usual trainer and inference agents.
wb::testing::OneTensorShape Shape() {
  wb::testing::OneTensorShape shape;
  shape.name = "w";
  shape.rows = 512;
  shape.cols = 1024;
  return shape;
}

}  // namespace

TEST_CASE("a source shrunk after registration fails the step, not the agent", "[security]") {
  Cluster cluster(wb::testing::Runfile(""), {});
  wb::testing::OneTensorShape shape = Shape();
  // f32 -> bf16: the sending agent converts on the CPU, reading every source byte.
  shape.src_dtype = v1::DTYPE_F32;
  auto sides = wb::testing::OneTensorSides::Open(cluster, shape);
  ControllerClient ctl = wb::testing::ConnectController(cluster);
  wb::testing::PlanOneToOne(&ctl, std::chrono::seconds(30));
  std::vector<float> ones(shape.rows * shape.cols, 1.0f);
  std::memcpy(sides.src.data(), ones.data(), sides.src.size());
  auto first = ctl.Step(1, std::chrono::seconds(20));
  INFO((first.ok() ? "" : std::string(first.status().message())));
  REQUIRE(first.ok());

  Shrink(sides.src);  // sides.src.data() must not be touched from here on
  auto step = ctl.Step(2, std::chrono::seconds(20));
  REQUIRE_FALSE(step.ok());
  const std::string error(step.status().message());
  INFO(error);
  CHECK_THAT(error, Catch::Contains("tensor 'w'") && Catch::Contains("ROLE_TRAINER rank 0") &&
                        Catch::Contains("shrunk"));
  CHECK(cluster.agent("trainer-node")->running());
  CHECK(cluster.agent("inference-node")->running());
}

TEST_CASE("a destination shrunk after registration fails the step, not the agent", "[security]") {
  // Trainer and inference on one agent: the local transport copies on the agent's CPU.
  wb::testing::ClusterOptions options;
  options.agents = {"node"};
  Cluster cluster(wb::testing::Runfile(""), options);
  wb::testing::OneTensorShape shape = Shape();
  shape.trainer_agent = shape.inference_agent = "node";
  auto sides = wb::testing::OneTensorSides::Open(cluster, shape);
  ControllerClient ctl = wb::testing::ConnectController(cluster);
  wb::testing::PlanOneToOne(&ctl, std::chrono::seconds(30));
  sides.Fill(0x5a);
  auto first = ctl.Step(1, std::chrono::seconds(20));
  INFO((first.ok() ? "" : std::string(first.status().message())));
  REQUIRE(first.ok());
  CHECK(sides.Same());

  Shrink(sides.dst);
  auto step = ctl.Step(2, std::chrono::seconds(20));
  REQUIRE_FALSE(step.ok());
  INFO(step.status().message());
  CHECK_THAT(std::string(step.status().message()), Catch::Contains("shrunk"));
  CHECK(cluster.agent("node")->running());
}

TEST_CASE("the SIGBUS guard turns a copy from a truncated mapping into an error", "[security]") {
  const size_t size = 1 << 20;
  int fd = memfd_create("wb-shrink", MFD_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, size) == 0);
  void* mem = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  REQUIRE(mem != MAP_FAILED);
  std::vector<char> out(size);
  CHECK(wb::registry::RunBusGuarded([&] { std::memcpy(out.data(), mem, size); }));
  REQUIRE(ftruncate(fd, 4096) == 0);
  CHECK_FALSE(wb::registry::RunBusGuarded([&] { std::memcpy(out.data(), mem, size); }));
  // Again, on the same thread: the guard and the signal are re-armed.
  CHECK_FALSE(wb::registry::RunBusGuarded([&] { std::memcpy(out.data(), mem, size); }));
  CHECK(wb::registry::RunBusGuarded([&] { std::memcpy(out.data(), mem, 4096); }));
  munmap(mem, size);
  close(fd);
}
