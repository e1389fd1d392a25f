// The release number and the git commit a binary was built from. The commit is stamped only by
// `./wb package` (bazel --workspace_status_command=tools/workspace_status.sh); other builds say
// "unknown" so that they keep their cached actions.
#pragma once

#include <string>

#include "common/version/version.h"

namespace wb::version {

// The full commit hash, "-dirty" appended when the tree had changes; "unknown" when not stamped.
const char* Commit();

// "<program> <number> (commit <commit>)": what --version prints.
std::string Line(const char* program);

}  // namespace wb::version
