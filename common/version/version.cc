#include "common/version/version.h"

#include "common/version/version_number.h"

namespace wb::version {

const char* Number() { return WB_VERSION_NUMBER; }

}  // namespace wb::version
