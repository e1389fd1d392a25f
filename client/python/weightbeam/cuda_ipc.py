"""CUDA IPC handles for GPU tensors, through ctypes on the CUDA runtime (no torch needed).

Like the C++ ``wb::gpu::GetIpcHandle``: the handle names the allocation that holds the pointer
(its base comes from the driver's cuMemGetAddressRange), plus the offset from that base. Without
libcudart / libcuda every call raises WeightbeamError("CUDA not available: ...").
"""

import ctypes
import glob
import os
import sys
import threading

from weightbeam.errors import WeightbeamError

IPC_HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)
_MEMORY_TYPE_DEVICE = 2  # cudaMemoryTypeDevice


class _PointerAttributes(ctypes.Structure):  # cudaPointerAttributes, CUDA 11 and later
    _fields_ = [("type", ctypes.c_int), ("device", ctypes.c_int),
                ("devicePointer", ctypes.c_void_p), ("hostPointer", ctypes.c_void_p)]


_libs = None
_libs_lock = threading.Lock()


def _candidates():
    names = ["libcudart.so", "libcudart.so.12", "libcudart.so.11.0"]
    dirs = []
    torch = sys.modules.get("torch")
    if torch is not None:  # torch wheels bundle the runtime
        dirs.append(os.path.join(os.path.dirname(torch.__file__), "lib"))
    for entry in sys.path:
        dirs.append(os.path.join(entry, "nvidia", "cuda_runtime", "lib"))
    dirs.append("/usr/local/cuda/lib64")
    found = [p for d in dirs for p in sorted(glob.glob(os.path.join(d, "libcudart.so*")))]
    return names + found


def _load():
    """(cudart, cuda driver) or WeightbeamError("CUDA not available: ...")."""
    global _libs
    with _libs_lock:
        if _libs is not None:
            return _libs
        cudart = None
        for name in _candidates():
            try:
                cudart = ctypes.CDLL(name)
                break
            except OSError:
                continue
        if cudart is None:
            raise WeightbeamError("CUDA not available: libcudart.so was not found, so this "
                                  "process cannot export GPU memory", "FAILED_PRECONDITION")
        try:
            driver = ctypes.CDLL("libcuda.so.1")
        except OSError:
            raise WeightbeamError("CUDA not available: no CUDA driver (libcuda.so.1)",
                                  "FAILED_PRECONDITION") from None
        cudart.cudaGetErrorName.restype = ctypes.c_char_p
        cudart.cudaGetErrorString.restype = ctypes.c_char_p
        _libs = (cudart, driver)
        return _libs


def _check(cudart, err, what):
    if err != 0:
        cudart.cudaGetLastError()
        name = cudart.cudaGetErrorName(err).decode()
        text = cudart.cudaGetErrorString(err).decode()
        raise WeightbeamError(f"{what}: {name} ({text})", "INTERNAL")


def available():
    """Whether this process can export GPU memory (a CUDA runtime and driver are present)."""
    try:
        _load()
        return True
    except WeightbeamError:
        return False


def get_ipc_handle(device_ptr, length):
    """(64-byte handle, offset from the allocation base, device) for [device_ptr, +length)."""
    cudart, driver = _load()
    attr = _PointerAttributes()
    _check(cudart, cudart.cudaPointerGetAttributes(ctypes.byref(attr),
                                                   ctypes.c_void_p(device_ptr)),
           "cudaPointerGetAttributes")
    if attr.type != _MEMORY_TYPE_DEVICE:
        raise WeightbeamError(f"pointer 0x{device_ptr:x} is not cudaMalloc'ed device memory; "
                              "CUDA IPC cannot export it", "INVALID_ARGUMENT")
    previous = ctypes.c_int(0)
    _check(cudart, cudart.cudaGetDevice(ctypes.byref(previous)), "cudaGetDevice")
    _check(cudart, cudart.cudaSetDevice(attr.device), f"cudaSetDevice({attr.device})")
    try:
        base = ctypes.c_uint64(0)
        size = ctypes.c_size_t(0)
        r = driver.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size),
                                           ctypes.c_uint64(device_ptr))
        if r != 0:
            raise WeightbeamError(f"cuMemGetAddressRange failed with CUresult {r}", "INTERNAL")
        offset = device_ptr - base.value
        if offset + length > size.value:
            raise WeightbeamError(
                f"range of {length} bytes at offset {offset} runs past its allocation of "
                f"{size.value} bytes on cuda:{attr.device}", "INVALID_ARGUMENT")
        handle = ctypes.create_string_buffer(IPC_HANDLE_BYTES)
        _check(cudart, cudart.cudaIpcGetMemHandle(handle, ctypes.c_void_p(base.value)),
               f"cudaIpcGetMemHandle on cuda:{attr.device}")
        return handle.raw, offset, attr.device
    finally:
        cudart.cudaSetDevice(previous.value)
