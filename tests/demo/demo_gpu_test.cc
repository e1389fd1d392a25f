// wb-demo --gpu as ./wb gpu-check runs it. Without a usable CUDA device it must stop before
// starting anything, say "no GPU: <why>" and exit with its own code (3), which gpu-check
// reports as "no GPU" rather than a failure; with a device it runs the whole demo with every
// trainer and inference buffer in GPU memory and must PASS (dense and delta).
#include <catch2/catch.hpp>
#include <string>

#include "daemon/gpu/device_memory.h"
#include "tests/demo/gpu_buffers.h"
#include "tests/support/process.h"

using wb::testing::Process;

namespace {

wb::testing::Output RunDemo(const std::vector<std::string>& extra) {
  const std::string dir = wb::testing::TempDir("wb-demo-gpu-");
  const std::string agent = wb::testing::Runfile("daemon/wb-agent");
  const std::string bin_dir =
      agent.substr(0, agent.size() - std::string("/daemon/wb-agent").size());
  std::vector<std::string> argv{wb::testing::Runfile("tests/demo/wb-demo"),
                                "--bin-dir",
                                bin_dir,
                                "--gpu",
                                "--layers",
                                "1",
                                "--steps",
                                "2"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  Process demo(argv, dir + "/demo.log");
  const int code = demo.Wait(std::chrono::seconds(240));
  return {code, wb::testing::ReadFile(dir + "/demo.log")};
}

}  // namespace

TEST_CASE("wb-demo --gpu: no GPU is said and exits 3; with a GPU every byte lands") {
  const auto delta = GENERATE(false, true);
  auto out = RunDemo(delta ? std::vector<std::string>{"--delta"} : std::vector<std::string>{});
  INFO(out.text);
  const absl::Status device = wb::demo::GpuDemoAvailable();
  if (!device.ok()) {
    CHECK(out.code == wb::demo::kNoGpuExitCode);
    CHECK_THAT(out.text, Catch::StartsWith("no GPU: ") &&
                             Catch::Contains(std::string(device.message())) &&
                             Catch::Contains("nothing was run"));
    CHECK_THAT(out.text, !Catch::Contains("registered:"));  // no process was started
    return;
  }
  CHECK(out.code == 0);
  CHECK_THAT(out.text, Catch::Contains("every buffer in GPU memory") && Catch::Contains("PASS: 2"));
}
