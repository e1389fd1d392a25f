"""A trainer rank's or inference worker's session with its node agent (Unix socket).

Mirrors the C++ ``wb::client::LocalSession``: one bidirectional ``Local.Session`` stream carries
hello / register / unregister, each answered before the next; the agent's error text comes back
unchanged as a WeightbeamError. Closing the session (or the process ending) withdraws the
tensors it registered. ``watch()`` subscribes to the node's begin/commit/abort events.
"""

import dataclasses
import os
import queue
import threading

import grpc

from weightbeam import _stubs, cuda_ipc
from weightbeam._closing import ClosesOnExit
from weightbeam.dtypes import itemsize, to_dtype
from weightbeam.errors import WeightbeamError, from_rpc_error
from weightbeam.shared_buffer import SharedBuffer, find_buffer
from weightbeam.version_check import CheckWatcher, HostTensor

local_pb2 = _stubs.local_pb2
local_pb2_grpc = _stubs.local_pb2_grpc
types_pb2 = _stubs.types_pb2

_ROLES = {"trainer": types_pb2.ROLE_TRAINER, "inference": types_pb2.ROLE_INFERENCE}
_KINDS = {
    types_pb2.Event.KIND_BEGIN: "begin",
    types_pb2.Event.KIND_COMMIT: "commit",
    types_pb2.Event.KIND_ABORT: "abort",
    5: "ready",  # Event.KIND_READY (by number, as below)
}
_KIND_SUBSCRIBED = 4  # Event.KIND_SUBSCRIBED (by number: older generated stubs lack the name)
_END = object()  # ends the request stream


@dataclasses.dataclass(frozen=True)
class StagedObject:
    """Where a "ready" event's staged bytes lie: a tensor at offset o of the shared-memory
    object ``shm_name`` (as registered) is staged at offset o of ``staging_shm_name``."""
    shm_name: str
    staging_shm_name: str
    length: int


@dataclasses.dataclass(frozen=True)
class Event:
    """A step event on this node: kind "begin", "commit", "abort" or (a watcher that swaps,
    agent receive.mode staged) "ready", the version, for an abort the reason, for "ready"
    where the staged bytes lie (``staged``, StagedObject's), for a "commit" of a plan made with
    ``digest=True`` each replica's digest of the version (``digests``: {replica: 16 hex})."""
    kind: str
    version: int
    reason: str = ""
    staged: tuple = ()
    digests: dict = dataclasses.field(default_factory=dict)


class LocalSession(ClosesOnExit):
    """``LocalSession(socket, role, rank, replica)``: role "trainer" or "inference"."""

    def __init__(self, socket, role, rank=0, replica=0, connect_timeout=5.0):
        if role not in _ROLES:
            raise ValueError(f"role {role!r}: expected 'trainer' or 'inference'")
        self._socket = socket
        self._channel = grpc.insecure_channel("unix:" + socket)
        try:
            grpc.channel_ready_future(self._channel).result(timeout=connect_timeout)
        except grpc.FutureTimeoutError:
            self._channel.close()
            raise WeightbeamError(f"no wb-agent answers on {socket} (is it running?)",
                                  "UNAVAILABLE") from None
        self._stub = local_pb2_grpc.LocalStub(self._channel)
        self._lock = threading.Lock()  # one request at a time on the stream
        self._requests = queue.Queue()
        self._responses = self._stub.Session(iter(self._requests.get, _END))
        self._next_id = 1
        self._closed = False
        self._events = queue.Queue()
        self.watcher_name = ""  # the acknowledging watch's (watch(ack=True) or swap=True)
        self._watch_call = None
        self._watcher = None
        self._ready = {}  # tensor name -> what sources_ready() waits for before a step
        self._host = {}  # tensor name -> HostTensor (what a user check is shown)
        self._host_lock = threading.Lock()
        self._check_watcher = None
        self._call(local_pb2.SessionRequest(hello=types_pb2.Owner(
            role=_ROLES[role], rank=rank, replica=replica, pid=os.getpid())))

    # ---- registration -------------------------------------------------------------------

    def register(self, name, dtype, global_shape, shard=None, buffer=None, offset=None,
                 length=None, view=None, ready=None):
        """Registers a tensor held in shared memory; returns the agent's TensorLayout.

        ``shard``: None for a full tensor, else one (start, size) per dimension; the memory holds
        the shard densely in row-major order. ``view``: None, or ``(buffer_shape, offset,
        buffer_name)`` when the memory holds a whole buffer (an engine parameter) and the shard
        is a part of it: its dims map onto the buffer's last dims, element [0..0] at ``offset``
        (one entry per buffer dim). ``buffer``: a SharedBuffer (``offset`` bytes in,
        ``length`` defaulting to what the shape needs), a NumPy view of one, or a host torch
        tensor made with ``torch.frombuffer`` on one; a CUDA tensor goes to register_cuda.
        ``ready``: what sources_ready() waits for before a step may read this tensor (an object
        with ``synchronize()``, e.g. a torch.cuda.Stream or Event, or a callable); CUDA tensors
        wait for their whole device by default.
        The agent's refusal (shape mismatch, duplicate name...) raises WeightbeamError.
        """
        if buffer is None:
            raise ValueError(f"tensor '{name}': no buffer given")
        if _is_cuda(buffer):
            return self.register_cuda(name, dtype, global_shape, shard, tensor=buffer, view=view,
                                      ready=ready)
        spec = _spec(name, dtype, global_shape, shard, view)
        if isinstance(buffer, SharedBuffer):
            shm, offset = buffer, 0 if offset is None else int(offset)
            if length is None:
                length = _spec_bytes(spec) or buffer.nbytes - offset
        else:
            address, nbytes = _host_memory(name, buffer)
            shm, start = find_buffer(address, nbytes)
            if shm is None:
                raise WeightbeamError(
                    f"tensor '{name}': its memory (0x{address:x}, {nbytes} bytes) is not in a "
                    "weightbeam SharedBuffer, and the agent can only map shared memory; allocate "
                    "it with SharedBuffer and use buf.array(...) or "
                    "torch.frombuffer(buf.memoryview(...), dtype=...)", "INVALID_ARGUMENT")
            if offset is not None or length is not None:
                raise ValueError(f"tensor '{name}': offset and length go with a SharedBuffer; "
                                 "an array or tensor registers all of its bytes")
            offset, length = start, nbytes
        memory = types_pb2.MemoryHandle(host_shm=types_pb2.HostShm(
            shm_name=shm.shm_name, offset=offset, length=int(length)))
        layout = self._register(spec, memory)
        with self._host_lock:
            self._host[name] = HostTensor(spec, shm.shm_name, offset, int(length))
        if ready is not None:
            self._ready[name] = _waiter(ready)
        return layout

    def register_cuda(self, name, dtype, global_shape, shard=None, tensor=None, device_ptr=None,
                      length=None, device=None, view=None, ready=None):
        """Registers GPU memory through a CUDA IPC handle: a CUDA torch tensor, or a raw
        ``device_ptr`` + ``length``. Needs libcudart here and an agent built with CUDA; without
        CUDA it raises WeightbeamError("CUDA not available: ...").

        The agent reads the memory on its own streams, so the trainer's kernels that write it
        must be finished before a step: sources_ready() waits for ``ready`` (a torch.cuda.Stream
        or Event, anything with ``synchronize()``, or a callable) or, by default, for every
        stream of this process on the tensor's device (cudaDeviceSynchronize)."""
        if tensor is not None:
            device_ptr, nbytes = _pointer_and_size(tensor)
            length = nbytes if length is None else length
        if device_ptr is None or length is None:
            raise ValueError(f"tensor '{name}': give a CUDA tensor or device_ptr and length")
        spec = _spec(name, dtype, global_shape, shard, view)
        handle, offset, dev, uuid, bus_id = cuda_ipc.get_ipc_handle(int(device_ptr), int(length))
        if device is not None and int(device) != dev:
            raise WeightbeamError(
                f"tensor '{name}': pointer is on cuda:{dev}, not cuda:{device}", "INVALID_ARGUMENT")
        # The device goes by its UUID (and PCI bus id): the agent's ordinals are not ours.
        memory = types_pb2.MemoryHandle(cuda_ipc=types_pb2.CudaIpc(
            ipc_handle=handle, offset=offset, length=int(length), device=dev, device_uuid=uuid,
            pci_bus_id=bus_id))
        layout = self._register(spec, memory)
        if ready is not None:
            self._ready[name] = _waiter(ready)
        else:
            def sync_device(d=dev):
                cuda_ipc.synchronize_device(d)
            sync_device._wb_key = ("device", dev)  # once per device, however many tensors
            self._ready[name] = sync_device
        return layout

    def sources_ready(self):
        """Call after the optimizer step and before the step is started (rank 0's
        ``ctl.step(version, ready=[session])``, or before the barrier that precedes it on the
        other ranks): waits until the writes of every tensor this session registered are
        finished (see register_cuda's ``ready``), so the agent never reads torn weights. Each
        distinct waiter runs once."""
        seen = set()
        for wait in list(self._ready.values()):
            key = getattr(wait, "_wb_key", wait)
            if key in seen:
                continue
            seen.add(key)
            wait()

    def unregister(self, name):
        """Withdraws a tensor this session registered."""
        with self._host_lock:
            self._host.pop(name, None)
        self._call(local_pb2.SessionRequest(unregister=local_pb2.UnregisterTensors(names=[name])))
        self._ready.pop(name, None)

    def publish(self, version):
        """Storage path (the agent runs with ``storage.role: publish``; trainer sessions):
        writes version ``version`` of every trainer tensor registered with this agent into its
        storage directory and returns the agent's ``PublishResult`` (anchor, bytes_written,
        dense_bytes, files, ...) once the version is complete there. Versions must increase."""
        response = self._call(local_pb2.SessionRequest(
            publish=local_pb2.PublishVersion(version=int(version))))
        return response.published

    # ---- events -------------------------------------------------------------------------

    def watch(self, confirm_timeout=5.0, ack=False, swap=False, watcher=None):
        """Subscribes to this node's events and returns once the agent confirms the
        subscription (up to ``confirm_timeout`` seconds): every event published after
        watch() returns is delivered. ``watch_start_version`` is then the agent's committed
        version at that moment.

        Agent receive.mode staged (docs/clients.md): with ``ack`` the swap of each version
        waits (up to the agent's receive.ack_timeout_ms) for ``ack(v)`` after "begin" v, sent
        once the engine has paused; with ``swap`` this watcher hears "ready" v instead of
        "begin", copies the staged bytes (``Event.staged``) into its live tensors itself and
        answers ``ack(v)``, or ``ack(v, error=...)`` when that failed. ``watcher`` names the
        watcher (default: one name per session, ``watcher_name``)."""
        if self._watcher is not None:
            return
        self._check_open()
        try:
            request = local_pb2.WatchEventsRequest(send_subscribed=True)
        except ValueError:  # stubs generated before the field existed
            request = local_pb2.WatchEventsRequest()
        if ack or swap:
            self.watcher_name = watcher or f"pid {os.getpid()} session {id(self):x}"
            request.ack = bool(ack)
            request.swap = bool(swap)
            request.watcher = self.watcher_name
        self._subscribed = threading.Event()
        self.watch_start_version = 0
        self._watch_call = self._stub.WatchEvents(request)
        self._watcher = threading.Thread(target=self._pump_events, name="wb-events", daemon=True)
        self._watcher.start()
        self._subscribed.wait(confirm_timeout)
        if (ack or swap) and self.watch_start_version == 0 and not self._events.empty():
            # Refused (no watcher name, swap on an agent writing in place): say why now.
            item = self._events.queue[0]
            if isinstance(item, WeightbeamError):
                raise item

    def check_versions(self, check, watcher=None, confirm_timeout=5.0):
        """Checks every staged version before it is committed (plans made with
        ``user_check=True``; agent receive.mode staged): ``check(version, tensors)`` gets this
        session's host tensors as read-only NumPy views of the staged bytes (BF16 as uint16)
        and accepts (None / True) or refuses (False, a string naming why, or an exception).
        A refusal aborts the version on every replica; the trainer's step raises StepFailed
        naming ``watcher`` and the reason. Runs on a thread of its own until close()."""
        self._check_open()
        if self._check_watcher is not None:
            raise WeightbeamError(f"check_versions: watcher '{self._check_watcher.name}' "
                                  "checks this session's versions already",
                                  "FAILED_PRECONDITION")
        name = watcher or f"check pid {os.getpid()} session {id(self):x}"

        def tensors():
            with self._host_lock:
                return dict(self._host)

        self._check_watcher = CheckWatcher(self, self._stub, check, name, tensors,
                                           confirm_timeout)
        return self._check_watcher

    def ack(self, version, error=""):
        """Answers the agent for ``version`` after watch(ack=True) (paused) or
        watch(swap=True) (swapped; a non-empty ``error``: the swap failed, which drops this
        replica from the step, naming the error)."""
        if not self.watcher_name:
            raise WeightbeamError("ack: watch with ack=True or swap=True first",
                                  "FAILED_PRECONDITION")
        self._call(local_pb2.SessionRequest(ack=local_pb2.AckVersion(
            version=version, watcher=self.watcher_name, error=error)))

    def next_event(self, timeout=None):
        """The next Event, or None after ``timeout`` seconds (None: wait for ever). Raises
        WeightbeamError when the agent ended the stream. Starts watching if not yet."""
        self.watch()
        try:
            item = self._events.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(item, WeightbeamError):
            self._events.put(item)  # stays ended for later calls
            raise item
        return item

    def events(self):
        """Iterates over events until the session closes or the agent ends the stream."""
        while True:
            try:
                yield self.next_event()
            except WeightbeamError:
                return

    # ---- lifetime -----------------------------------------------------------------------

    def close(self):
        """Ends the session: the agent withdraws this session's tensors."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._requests.put(_END)
            try:
                for _ in self._responses:  # drain until the agent finishes the stream
                    pass
            except grpc.RpcError:
                pass
        if self._watch_call is not None:
            self._watch_call.cancel()
            self._watcher.join()
        if self._check_watcher is not None:
            self._check_watcher.close()
        self._channel.close()

    # ---- internals ----------------------------------------------------------------------

    def _register(self, spec, memory):
        request = local_pb2.SessionRequest(register=local_pb2.RegisterTensors(
            tensors=[local_pb2.TensorRegistration(spec=spec, memory=memory)]))
        response = self._call(request)
        return response.registered[0] if response.registered else None

    def _call(self, request):
        with self._lock:
            self._check_open()
            request.request_id = self._next_id
            self._next_id += 1
            self._requests.put(request)
            try:
                response = next(self._responses)
            except StopIteration:
                raise WeightbeamError(f"the agent at {self._socket} closed the session",
                                      "UNAVAILABLE") from None
            except grpc.RpcError as e:
                raise from_rpc_error(e, f"the agent at {self._socket}") from None
        if response.code != 0:
            raise WeightbeamError(response.message, response.code)
        return response

    def _pump_events(self):
        try:
            for e in self._watch_call:
                if e.kind == _KIND_SUBSCRIBED:
                    self.watch_start_version = e.version
                    self._subscribed.set()
                    continue
                staged = tuple(StagedObject(o.shm_name, o.staging_shm_name, o.length)
                               for o in e.staged)
                digests = {d.replica: d.digest for d in getattr(e, "digests", ())}
                self._events.put(Event(_KINDS.get(e.kind, "unspecified"), e.version, e.reason,
                                       staged, digests))
            end = WeightbeamError("the agent ended the event stream", "UNAVAILABLE")
        except grpc.RpcError as e:
            end = WeightbeamError(
                "the event stream was closed" if e.code() == grpc.StatusCode.CANCELLED
                else f"the agent ended the event stream: {e.details()}", e.code().name)
        self._events.put(end)
        self._subscribed.set()

    def _check_open(self):
        if self._closed:
            raise WeightbeamError("the session is closed", "FAILED_PRECONDITION")


def _spec(name, dtype, global_shape, shard, view=None):
    spec = types_pb2.TensorSpec(name=name, dtype=to_dtype(dtype),
                                global_shape=[int(d) for d in global_shape])
    for start, size in shard or ():
        spec.shard.add(start=int(start), size=int(size))
    if view is not None:
        shape, offset, buffer_name = view
        spec.view.shape.extend(int(d) for d in shape)
        spec.view.offset.extend(int(o) for o in offset)
        spec.view.buffer = str(buffer_name)
    return spec


def _spec_bytes(spec):
    n = 1
    if spec.HasField("view"):
        dims = spec.view.shape
    else:
        dims = (s.size for s in spec.shard) if spec.shard else spec.global_shape
    for d in dims:
        n *= d
    return n * itemsize(spec.dtype)


def _waiter(ready):
    """A callable that waits for ``ready`` (something with synchronize(), or a callable); the
    same stream registered for many tensors is waited for once."""
    if hasattr(ready, "synchronize"):
        def wait():
            ready.synchronize()
        wait._wb_key = id(ready)
        return wait
    if callable(ready):
        return ready
    raise TypeError(f"ready={ready!r}: expected a stream or event (synchronize()) or a callable")


def _is_cuda(obj):
    return bool(getattr(obj, "is_cuda", False))


def _pointer_and_size(obj):
    """(address, bytes) of a NumPy array or an object with data_ptr() (a torch tensor)."""
    if hasattr(obj, "__array_interface__"):
        if not obj.flags["C_CONTIGUOUS"]:
            raise ValueError("the array is not C-contiguous; register a contiguous view")
        return obj.__array_interface__["data"][0], obj.nbytes
    if hasattr(obj, "data_ptr"):
        if hasattr(obj, "is_contiguous") and not obj.is_contiguous():
            raise ValueError("the tensor is not contiguous; register a contiguous tensor")
        nbytes = getattr(obj, "nbytes", None)
        if nbytes is None:
            nbytes = obj.numel() * obj.element_size()
        return obj.data_ptr(), int(nbytes)
    raise TypeError(f"{type(obj).__name__} is neither a SharedBuffer, an array nor a tensor")


def _host_memory(name, obj):
    try:
        return _pointer_and_size(obj)
    except (TypeError, ValueError) as e:
        raise WeightbeamError(f"tensor '{name}': {e}", "INVALID_ARGUMENT") from None
