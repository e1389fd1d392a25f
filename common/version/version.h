// The weightbeam release number, from the VERSION file at the repository's root.
#pragma once

namespace wb::version {

// "0.1.0": what agents report to the controller and the controller in its status.
const char* Number();

}  // namespace wb::version
