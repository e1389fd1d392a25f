"""weightbeam for Python training loops and inference workers.

Two facades, as in the C++ client library:
  LocalSession(socket, role, rank, replica): register tensors with this node's agent, watch
    begin/commit/abort events.
  ControllerClient(address): plan once, then step(version) after each optimizer step.
Host tensors live in a SharedBuffer (POSIX shared memory the agent maps).
"""

import pkgutil

# The generated stubs (weightbeam/v1/) may sit in another directory on sys.path (Bazel's
# bazel-bin/client/python): let this package span both.
__path__ = pkgutil.extend_path(__path__, __name__)

from weightbeam.errors import StepFailed, StepTimeout, WeightbeamError  # noqa: E402
from weightbeam.shared_buffer import SharedBuffer  # noqa: E402
from weightbeam.local_session import Event, LocalSession  # noqa: E402
from weightbeam.controller_client import ControllerClient, StepHandle  # noqa: E402
from weightbeam import engines  # noqa: E402,F401

try:  # written into the wheel and sdist by `./wb package` (deploy/package.sh)
    from weightbeam._version import __commit__, __version__  # noqa: E402
except ImportError:  # a source checkout
    __version__, __commit__ = "0+source", "unknown"

__all__ = [
    "ControllerClient", "Event", "LocalSession", "SharedBuffer", "StepFailed", "StepHandle", "StepTimeout",
    "WeightbeamError",
    "__version__",
]
