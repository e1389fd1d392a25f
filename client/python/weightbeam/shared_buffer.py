"""Host memory the node agent can reach: a POSIX shared-memory object mapped into this process.

Training loops and inference workers put tensors here (as NumPy views, or PyTorch tensors made
with ``torch.frombuffer``) and register them with their agent. Mirrors the C++
``wb::client::SharedBuffer``: the name is unique per process and the object is unlinked on close.
"""

import ctypes
import itertools
import mmap
import os
import threading
import weakref

import numpy as np

from weightbeam._closing import ClosesOnExit
from weightbeam.errors import WeightbeamError

_SHM_DIR = "/dev/shm"
_counter = itertools.count()
_live_lock = threading.Lock()
_live = weakref.WeakSet()  # every open SharedBuffer, to find the one holding a pointer


class SharedBuffer(ClosesOnExit):
    """``nbytes`` of zero-filled shared memory named ``/wb-<pid>-<hint>-<n>``."""

    def __init__(self, nbytes, hint="buf"):
        nbytes = int(nbytes)
        if nbytes <= 0:
            raise WeightbeamError("a shared buffer needs at least one byte")
        if "/" in hint:
            raise WeightbeamError(f"shared buffer hint '{hint}' must not contain '/'")
        self._name = f"/wb-{os.getpid()}-{hint}-{next(_counter)}"
        path = _SHM_DIR + self._name
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as e:
            raise WeightbeamError(f"shm_open {self._name}: {e.strerror}") from e
        try:
            os.ftruncate(fd, nbytes)
            self._mmap = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as e:
            os.unlink(path)
            raise WeightbeamError(
                f"sizing and mapping {self._name} ({nbytes} bytes): {e.strerror}") from e
        finally:
            os.close(fd)
        probe = ctypes.c_char.from_buffer(self._mmap)
        self._address = ctypes.addressof(probe)
        del probe  # an exported pointer would keep close() from unmapping
        self._nbytes = nbytes
        self._closed = False
        with _live_lock:
            _live.add(self)

    @property
    def shm_name(self):
        """The name as passed to shm_open, e.g. ``/wb-1234-buf-0``."""
        return self._name

    @property
    def nbytes(self):
        return self._nbytes

    @property
    def address(self):
        """Where the mapping starts in this process."""
        return self._address

    def memoryview(self, offset=0, nbytes=None):
        """A writable memoryview of ``nbytes`` at ``offset`` (for ``torch.frombuffer``)."""
        self._check_open()
        nbytes = self._nbytes - offset if nbytes is None else nbytes
        self._check_range(offset, nbytes)
        return memoryview(self._mmap)[offset:offset + nbytes]

    def array(self, dtype, shape, offset=0):
        """A C-contiguous NumPy view of ``shape`` elements of ``dtype`` at byte ``offset``.

        NumPy has no bfloat16: view BF16 tensors as ``np.uint16`` and register them as "bf16".
        """
        self._check_open()
        dtype = np.dtype(dtype)
        shape = tuple(int(d) for d in np.atleast_1d(shape)) if not isinstance(shape, int) \
            else (shape,)
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        self._check_range(offset, count * dtype.itemsize)
        return np.frombuffer(self._mmap, dtype=dtype, count=count, offset=offset).reshape(shape)

    def contains(self, address, nbytes):
        """The offset of [address, address + nbytes) in this buffer, or None if it is outside."""
        if self._closed or address < self._address:
            return None
        offset = address - self._address
        return offset if offset + nbytes <= self._nbytes else None

    def close(self):
        """Unlinks the name; unmaps unless NumPy/torch views are still alive (they keep it)."""
        if self._closed:
            return
        self._closed = True
        with _live_lock:
            _live.discard(self)
        try:
            os.unlink(_SHM_DIR + self._name)
        except FileNotFoundError:
            pass
        try:
            self._mmap.close()
        except BufferError:
            pass  # views still reference the mapping; it goes when the last one does

    def __repr__(self):
        return f"SharedBuffer({self._name!r}, {self._nbytes} bytes)"

    def _check_open(self):
        if self._closed:
            raise WeightbeamError(f"shared buffer {self._name} is closed")

    def _check_range(self, offset, nbytes):
        if offset < 0 or nbytes < 0 or offset + nbytes > self._nbytes:
            raise WeightbeamError(
                f"shared buffer {self._name} holds {self._nbytes} bytes, too small for offset "
                f"{offset} + length {nbytes}")


def find_buffer(address, nbytes):
    """The open SharedBuffer holding [address, address + nbytes) and the offset in it."""
    with _live_lock:
        buffers = list(_live)
    for buf in buffers:
        offset = buf.contains(address, nbytes)
        if offset is not None:
            return buf, offset
    return None, None
