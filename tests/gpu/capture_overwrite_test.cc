// GPU capture under an immediate overwrite (issue 41, item 1), with real processes: a
// controller, a trainer agent with a capture budget and an inference agent (host memory).
// The trainer (this process, not the agent) holds a 1 GiB CUDA tensor. The moment
// step_captured returns (StepAsync's WaitCaptured) it overwrites the whole tensor with a
// device-to-device copy; every byte that lands must equal the snapshot taken before: a capture
// copy still running on the device when the agent said "captured" would read the new bytes.
// Without a GPU it prints "skipped: ..." and passes (./wb gpu-check runs it on one).
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "client/weightbeam/controller_client.h"
#include "client/weightbeam/local_session.h"
#include "client/weightbeam/shared_buffer.h"
#include "daemon/gpu/device_memory.h"
#include "daemon/gpu/staging.h"
#include "tests/support/cluster.h"
#include "tests/support/controller_calls.h"
#include "tests/support/one_tensor.h"

namespace v1 = weightbeam::v1;
using namespace wb::client;
using std::chrono::milliseconds;

namespace {
constexpr int64_t kRows = 16384, kCols = 32768;  // BF16: 1 GiB
constexpr uint64_t kBytes = kRows * kCols * 2;

std::vector<uint8_t> Pattern(uint8_t seed) {
  std::vector<uint8_t> b(kBytes);
  for (uint64_t i = 0; i < kBytes; ++i) b[i] = static_cast<uint8_t>(i * 13 + seed + (i >> 20));
  return b;
}
}  // namespace

TEST_CASE("gpu capture: an overwrite the moment step_captured returns never lands", "[gpu]") {
  if (auto s = wb::gpu::CudaAvailable(); !s.ok()) {
    WARN("skipped: " << s.message());
    return;
  }
  wb::testing::ClusterOptions options;
  options.agents = {"trainer-node", "infer-0"};
  options.inference_replicas = 1;
  options.agent_yaml["trainer-node"] = "capture:\n  max_bytes: 2147483648\n";
  wb::testing::Cluster cluster(wb::testing::Runfile(""), options);

  auto source = wb::gpu::DeviceBuffer::Allocate(kBytes, 0);
  REQUIRE(source.ok());
  auto other = wb::gpu::DeviceBuffer::Allocate(kBytes, 0);  // the overwrite's bytes
  REQUIRE(other.ok());
  auto trainer =
      LocalSession::Connect(cluster.socket("trainer-node"), Identity{v1::ROLE_TRAINER, 0, 0});
  REQUIRE(trainer.ok());
  REQUIRE(trainer
              ->RegisterCuda(TensorInfo{"w", v1::DTYPE_BF16, {kRows, kCols}, {}}, source->data(),
                             kBytes, 0)
              .ok());
  auto buffer = SharedBuffer::Create(kBytes, "overwrite-dst");
  REQUIRE(buffer.ok());
  auto inference =
      LocalSession::Connect(cluster.socket("infer-0"), Identity{v1::ROLE_INFERENCE, 0, 0});
  REQUIRE(inference.ok());
  REQUIRE(
      inference->Register(TensorInfo{"w", v1::DTYPE_BF16, {kRows, kCols}, {}}, *buffer, 0, kBytes)
          .ok());
  auto ctl = wb::testing::ConnectController(cluster);
  wb::testing::PlanWorld(&ctl, wb::testing::World(1, 1, 1));

  for (uint8_t v = 1; v <= 3; ++v) {
    INFO("version " << int(v));
    const std::vector<uint8_t> snapshot = Pattern(v);
    REQUIRE(wb::gpu::CopyHostToDevice(source->data(), snapshot.data(), kBytes).ok());
    const std::vector<uint8_t> next = Pattern(static_cast<uint8_t>(v + 100));
    REQUIRE(wb::gpu::CopyHostToDevice(other->data(), next.data(), kBytes).ok());
    REQUIRE(trainer->SourcesReady().ok());
    auto step = ctl.StepAsync(v, milliseconds(120000));
    REQUIRE(step.WaitCaptured(milliseconds(120000)).ok());
    // At once: the trainer's next optimizer step, as a device-to-device copy.
    REQUIRE(wb::gpu::CopyAnyToAny(source->data(), other->data(), kBytes, 0).ok());
    auto result = step.Result(milliseconds(120000));
    REQUIRE(result.ok());
    CHECK(std::memcmp(buffer->data(), snapshot.data(), kBytes) == 0);
  }
}
