"""Host tensors mirrored into one SharedBuffer the node agent maps (the trainer side of
registration from a real model: dtensor_params, megatron_params). ``refresh`` copies the
tensors' current bytes into the mirror before each push; CUDA tensors are not mirrored (they
register in place, by IPC handle)."""

import torch

from weightbeam.shared_buffer import SharedBuffer

_ALIGN = 64


class HostMirror:
    """``tensors``: name -> tensor; the non-empty host ones get a view of one SharedBuffer
    (named after ``label``), same dtype and shape."""

    def __init__(self, tensors, label):
        host = {n: t for n, t in tensors.items() if not t.is_cuda and t.numel() > 0}
        sizes = {n: t.numel() * t.element_size() for n, t in host.items()}
        self.views = {}
        self._buffer = SharedBuffer(sum(_aligned(s) for s in sizes.values()), label) \
            if host else None
        offset = 0
        for name, t in host.items():
            self.views[name] = torch.frombuffer(
                self._buffer.memoryview(offset, sizes[name]), dtype=t.dtype).view(t.shape)
            offset += _aligned(sizes[name])

    def refresh(self, current):
        """Copies ``current(name)`` (the tensor's bytes now) into each mirrored view."""
        with torch.no_grad():
            for name, view in self.views.items():
                view.copy_(current(name))

    def close(self):
        self.views = {}
        if self._buffer is not None:
            self._buffer, buffer = None, self._buffer
            buffer.close()


def _aligned(n):
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN
