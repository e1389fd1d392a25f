"""User checks of staged versions (VersionChecks.user, docs/clients.md "Versions checked before
they go live"): an inference process hands the agent a callback that looks at every staged
version before it is committed, e.g. a few-token smoke forward or a norm bound.

``LocalSession.check_versions(check)`` opens a watch stream of its own that hears only this
user's check(v). For each, ``check(version, tensors)`` runs on the watcher's thread with
``tensors``: this session's host tensors as read-only NumPy views of their *staged* bytes
(BF16 as uint16, FP8 as uint8: the raw bits). It accepts by returning None or True; it
refuses by returning False or a string (the reason), or by raising. The verdict goes back as
AckVersion{check: true}; a refusal aborts the version on every replica and the trainer's step
raises StepFailed naming this watcher and the reason. CUDA tensors are not passed (their
staging lies on the device).
"""

import mmap
import os
import threading

import numpy as np

from weightbeam import _stubs
from weightbeam.errors import WeightbeamError

local_pb2 = _stubs.local_pb2
types_pb2 = _stubs.types_pb2

_KIND_CHECK = 6  # Event.KIND_CHECK (by number: older stubs lack the name)
_KIND_SUBSCRIBED = 4
_NUMPY = {
    types_pb2.DTYPE_F32: np.float32, types_pb2.DTYPE_F16: np.float16,
    types_pb2.DTYPE_BF16: np.uint16, types_pb2.DTYPE_F8_E4M3: np.uint8,
    types_pb2.DTYPE_I32: np.int32, types_pb2.DTYPE_I64: np.int64, types_pb2.DTYPE_U8: np.uint8,
}


class HostTensor:
    """Where a registered host tensor lies: ``length`` bytes at ``offset`` of ``shm_name``."""

    def __init__(self, spec, shm_name, offset, length):
        self.dtype = spec.dtype
        if spec.HasField("view"):
            self.shape = tuple(spec.view.shape)
        elif spec.shard:
            self.shape = tuple(s.size for s in spec.shard)
        else:
            self.shape = tuple(spec.global_shape)
        self.shm_name = shm_name.lstrip("/")
        self.offset = offset
        self.length = length


def staged_views(tensors, staged):
    """``{name: read-only array}`` of ``tensors`` (name -> HostTensor) at their staged place
    (``staged``: the event's StagedObject list); the maps stay open while the arrays live."""
    maps, out = {}, {}
    by_object = {o.shm_name.lstrip("/"): o for o in staged}
    for name, t in tensors.items():
        o = by_object.get(t.shm_name)
        if o is None or t.dtype not in _NUMPY:
            continue
        if o.staging_shm_name not in maps:
            fd = os.open("/dev/shm/" + o.staging_shm_name.lstrip("/"), os.O_RDONLY)
            try:
                maps[o.staging_shm_name] = mmap.mmap(fd, o.length, mmap.MAP_SHARED,
                                                     mmap.PROT_READ)
            finally:
                os.close(fd)
        dtype = np.dtype(_NUMPY[t.dtype])
        count = t.length // dtype.itemsize
        a = np.frombuffer(maps[o.staging_shm_name], dtype, count, t.offset)
        n = int(np.prod(t.shape)) if t.shape else 1
        out[name] = a[:n].reshape(t.shape) if n <= count else a
    return out


def _verdict(check, version, views):
    """The error text for AckVersion ("" accepts)."""
    try:
        answer = check(version, views)
    except Exception as e:  # the user's check failed: that refuses the version, naming why
        return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    if answer is None or answer is True:
        return ""
    if answer is False:
        return "the check returned False"
    return str(answer) or "refused"


class CheckWatcher:
    """The thread behind LocalSession.check_versions (one per session)."""

    def __init__(self, session, stub, check, watcher, tensors, confirm_timeout):
        self.name = watcher
        self.checked = 0  # versions answered
        self._session, self._check, self._tensors = session, check, tensors
        request = local_pb2.WatchEventsRequest(send_subscribed=True, check=True, watcher=watcher)
        self._call = stub.WatchEvents(request)
        self._subscribed = threading.Event()
        self._error = None
        self._thread = threading.Thread(target=self._run, name="wb-check", daemon=True)
        self._thread.start()
        self._subscribed.wait(confirm_timeout)
        if self._error is not None:
            raise self._error

    def _run(self):
        try:
            for e in self._call:
                if e.kind == _KIND_SUBSCRIBED:
                    self._subscribed.set()
                elif e.kind == _KIND_CHECK:
                    self._answer(e)
        except Exception as e:  # the stream ended (refused, cancelled, agent gone)
            code = getattr(e, "code", lambda: None)()
            details = getattr(e, "details", lambda: str(e))()
            self._error = WeightbeamError(f"check watcher '{self.name}': {details}",
                                          code.name if code is not None else "UNKNOWN")
        self._subscribed.set()

    def _answer(self, event):
        try:
            views = staged_views(self._tensors(), event.staged)
        except (OSError, ValueError) as e:  # refused, naming why, rather than left unanswered
            error = f"the staged bytes could not be mapped: {e}"
        else:
            error = _verdict(self._check, event.version, views)
            del views
        self._session._call(local_pb2.SessionRequest(ack=local_pb2.AckVersion(
            version=event.version, watcher=self.name, error=error, check=True)))
        self.checked += 1

    def close(self):
        self._call.cancel()
        self._thread.join()
