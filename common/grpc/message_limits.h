// How large one control-plane gRPC message may be. gRPC refuses messages over 4 MiB by default;
// a 10^6-tensor layout (~150 MiB) or a plan with millions of operations is far larger, so every
// server and channel that carries layouts or plans raises its receive limit to this.
#pragma once

namespace wb {

constexpr int kMaxControlMessageBytes = 1 << 30;  // 1 GiB (protobuf's own cap is 2 GiB)

}  // namespace wb
