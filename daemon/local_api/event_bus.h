// The agent's begin/commit/abort events, fanned out to local watchers.
#pragma once

#include "common/grpc/broadcast.h"
#include "weightbeam/v1/types.pb.h"

namespace wb::local {

using EventBus = Broadcaster<weightbeam::v1::Event>;

}  // namespace wb::local
