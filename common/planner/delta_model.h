// A delta step's duration, predicted from a dense plan's statistics: the planner's cost model
// prices a dense step only, and a delta step moves a fraction of its bytes but still compares
// every byte at the senders and applies records at the receivers (docs/delta-mode.md).
//
//   packed fraction  p = min(1, changed x (element_bytes + index_bytes) / element_bytes)
//   encode           max over sending devices of dense bytes / encode_gbps
//   send             the dense link limit x p, plus the dense prediction's per-op part (every
//                    op still runs, each with its header)
//   apply            max over receiving devices of dense bytes x p / apply_gbps
//   step             max(encode, send) + apply   (sends follow each op's encode; records are
//                    applied once they have all landed, before the commit)
//
// Each sending device's bytes count once per executed op (fan-out destinations included), as
// the executor compares each executed op's source.
#pragma once

#include "common/planner/plan.h"

namespace wb::planner {

struct DeltaModel {
  double changed_fraction = 0.01;  // of the elements, per step
  // Dense bytes compared per second per sending device. Default: the GPU encoder with its
  // shadow on the device, measured on one H100 (166-169 GB/s, docs/gpu.md); the CPU codec
  // compares 3.9-6.8 GB/s per prepare thread (docs/performance.md).
  double encode_gbps = 166;
  // Packed bytes applied per second per receiving device. Default: an assumption (the GPU
  // scatter moved the bench's records in 0.46 ms on the H100, no bytes-per-second figure).
  double apply_gbps = 100;
  double element_bytes = 2;  // BF16; FP8 destinations are 1
  double index_bytes = 2;    // per changed element: its gap from the previous one (1 to 4)
};

struct DeltaPrediction {
  double seconds = 0;
  double encode_seconds = 0;
  double send_seconds = 0;
  double apply_seconds = 0;
  double packed_fraction = 0;  // bytes on the wire / dense bytes
};

DeltaPrediction PredictDeltaStep(const PlanStats& stats, const DeltaModel& model);

// The pieces, for callers that know the encode and apply rates per agent instead of per device
// (controller/delta_prediction.h): the packed fraction of a model, and a step from its parts
// (send = link limit x packed + the dense prediction's per-op part; step = max(encode, send) +
// apply).
double PackedFraction(const DeltaModel& model);
DeltaPrediction DeltaStepFromParts(double encode_seconds, double apply_seconds,
                                   double packed_fraction, double link_limit_seconds,
                                   double predicted_step_seconds);

}  // namespace wb::planner
