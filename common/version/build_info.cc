#include "common/version/build_info.h"

namespace wb::version {

std::string Line(const char* program) {
  return std::string(program) + " " + Number() + " (commit " + Commit() + ")";
}

}  // namespace wb::version
