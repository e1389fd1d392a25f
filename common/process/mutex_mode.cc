#include "common/process/mutex_mode.h"

#include "absl/synchronization/mutex.h"

namespace wb {

void UseFastMutexes() { absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore); }

}  // namespace wb
