// libFuzzer target for the Local TrainerLayout RPC (common/engines/engine_layout_proto.h,
// AnswerTrainerLayout): any local client sends a TrainerLayoutRequest, parallel settings
// (tp / pp / ep / etp / dp and their ranks, stage layers, make_vocab_size_divisible_by, the
// DTensor mesh, coordinates and placement rules) and config.json alike. Input: the request's
// protobuf bytes (seeds: make_trainer_layout_seeds.sh). Invariants: nothing crashes (issue 41,
// item 7: 2^62 x tp 4 wrapped to 0 and the agent died of SIGFPE) or throws; a refusal is
// INVALID_ARGUMENT; an accepted layout has only non-negative dims and every part's box inside
// its source shape.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>

#include "common/engines/engine_layout_proto.h"
#include "weightbeam/v1/local.pb.h"

namespace {
[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "trainer_layout_fuzz invariant violated: %s\n", what);
  __builtin_trap();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  weightbeam::v1::TrainerLayoutRequest req;
  if (!req.ParseFromArray(data, static_cast<int>(size))) return 0;
  try {
    auto answer = wb::engines::AnswerTrainerLayout(req);
    if (!answer.ok()) {
      if (answer.status().code() != absl::StatusCode::kInvalidArgument) {
        Fail("a refusal that is not INVALID_ARGUMENT");
      }
      return 0;
    }
    for (const auto& t : answer->tensors()) {
      for (int64_t d : t.shape()) {
        if (d < 0) Fail("a negative dim in a trainer tensor");
      }
      for (const auto& p : t.parts()) {
        if (p.box_size() != p.source_shape_size()) Fail("a part's box rank is not its source's");
        for (int i = 0; i < p.box_size(); ++i) {
          const auto& b = p.box(i);
          if (b.start() < 0 || b.size() < 0 || b.start() + b.size() > p.source_shape(i)) {
            Fail("a part's box outside its source shape");
          }
        }
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainer_layout_fuzz: exception %s\n", e.what());
    Fail("an exception escaped");
  }
  return 0;
}
