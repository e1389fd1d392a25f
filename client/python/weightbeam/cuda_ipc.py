"""CUDA IPC handles for GPU tensors, through ctypes on the CUDA runtime (no torch needed).

Like the C++ ``wb::gpu::GetIpcHandle``: the handle names the allocation that holds the pointer
(its base comes from the driver's cuMemGetAddressRange), plus the offset from that base, and the
device is named by its UUID and PCI bus id (the agent resolves them to its own ordinal: ordinals
differ between processes under CUDA_VISIBLE_DEVICES). Memory CUDA IPC cannot export (PyTorch's
expandable segments, vLLM's cumem allocator, cudaMallocAsync pools) is refused with the allocator
setting to change. Without libcudart / libcuda every call raises
WeightbeamError("CUDA not available: ...").
"""

import ctypes
import glob
import os
import sys
import threading

from weightbeam.errors import WeightbeamError

IPC_HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)
_MEMORY_TYPE_DEVICE = 2  # cudaMemoryTypeDevice
# CUpointer_attribute (cuda.h)
_CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE = 10
_CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE = 17


class _PointerAttributes(ctypes.Structure):
    """cudaPointerAttributes of CUDA 11 and later (driver_types.h): 88 bytes on 64-bit Linux.
    tests/python/test_cuda_ipc.py checks it against the header the build uses."""
    _fields_ = [("type", ctypes.c_int), ("device", ctypes.c_int),
                ("devicePointer", ctypes.c_void_p), ("hostPointer", ctypes.c_void_p),
                ("reserved", ctypes.c_long * 8)]


class _Uuid(ctypes.Structure):  # cudaUUID_t / CUuuid
    _fields_ = [("bytes", ctypes.c_ubyte * 16)]


_libs = None
_libs_lock = threading.Lock()


def _loaded_cudart(maps_path="/proc/self/maps"):
    """Paths of the libcudart shared objects already mapped into this process (torch's, say)."""
    paths = []
    try:
        with open(maps_path) as maps:
            for line in maps:
                path = line.split(None, 5)[5].strip() if len(line.split(None, 5)) == 6 else ""
                if "/libcudart.so" in path and path not in paths and os.path.exists(path):
                    paths.append(path)
    except OSError:
        pass
    return paths


def _candidates(loaded=None, modules=None, search_path=None):
    """Where to load libcudart from, best first: the runtime this process already loaded (torch
    or another library: one runtime per process, the same one it allocated with), torch's
    bundled runtime, the nvidia-cuda-runtime wheel, the toolkit, then versioned sonames, and
    the unversioned development name last (it may be a different toolkit than torch's)."""
    loaded = _loaded_cudart() if loaded is None else loaded
    modules = sys.modules if modules is None else modules
    search_path = sys.path if search_path is None else search_path
    dirs = []
    torch = modules.get("torch")
    if torch is not None and getattr(torch, "__file__", None):  # torch wheels bundle the runtime
        dirs.append(os.path.join(os.path.dirname(torch.__file__), "lib"))
    for entry in search_path:
        dirs.append(os.path.join(entry, "nvidia", "cuda_runtime", "lib"))
    dirs.append("/usr/local/cuda/lib64")

    def newest_first(paths):
        return sorted(paths, key=lambda p: (p.count("."), p), reverse=True)

    found = [p for d in dirs for p in newest_first(glob.glob(os.path.join(d, "libcudart.so.*")))]
    names = ["libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"]
    out = []
    for c in list(loaded) + found + names:
        if c not in out:
            out.append(c)
    return out


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


def not_ipc_capable_message(device_ptr, device, from_pool):
    """The refusal for memory cudaIpcGetMemHandle cannot export (wb::gpu::NotIpcCapableMessage)."""
    kind = ("stream-ordered memory (cudaMallocAsync / a CUDA memory pool)" if from_pool
            else "a virtual-memory (cuMemCreate) mapping")
    return (f"pointer 0x{device_ptr:x} on cuda:{device} is {kind}, which CUDA IPC cannot export; "
            "allocate the weights with plain cudaMalloc: PyTorch: PYTORCH_CUDA_ALLOC_CONF without "
            "expandable_segments:True and without backend:cudaMallocAsync; vLLM: sleep mode off "
            "(enable_sleep_mode=False, its cumem allocator); C++: cudaMalloc instead of "
            "cudaMallocAsync or cuMemCreate")


def device_identity(device):
    """(16-byte UUID, PCI bus id) of this process's cuda:``device``: the same device in every
    process, whatever its ordinal there."""
    cudart, driver = _load()
    dev = ctypes.c_int(0)
    r = driver.cuDeviceGet(ctypes.byref(dev), ctypes.c_int(device))
    if r != 0:
        raise WeightbeamError(f"cuDeviceGet({device}) failed with CUresult {r}", "INTERNAL")
    uuid = _Uuid()
    get_uuid = getattr(driver, "cuDeviceGetUuid_v2", None) or driver.cuDeviceGetUuid
    r = get_uuid(ctypes.byref(uuid), dev)
    if r != 0:
        raise WeightbeamError(f"cuDeviceGetUuid({device}) failed with CUresult {r}", "INTERNAL")
    bus_id = ctypes.create_string_buffer(32)
    _check(cudart, cudart.cudaDeviceGetPCIBusId(bus_id, ctypes.c_int(32), ctypes.c_int(device)),
           f"cudaDeviceGetPCIBusId({device})")
    return bytes(bytearray(uuid.bytes)), bus_id.value.decode()


def get_ipc_handle(device_ptr, length):
    """(64-byte handle, offset from the allocation base, device, uuid, pci bus id) for
    [device_ptr, +length)."""
    cudart, driver = _load()
    attr = _PointerAttributes()
    _check(cudart, cudart.cudaPointerGetAttributes(ctypes.byref(attr),
                                                   ctypes.c_void_p(device_ptr)),
           "cudaPointerGetAttributes")
    if attr.type != _MEMORY_TYPE_DEVICE:
        raise WeightbeamError(f"pointer 0x{device_ptr:x} is not cudaMalloc'ed device memory; "
                              "CUDA IPC cannot export it", "INVALID_ARGUMENT")
    legacy_ipc = ctypes.c_int(1)
    r = driver.cuPointerGetAttribute(ctypes.byref(legacy_ipc),
                                     _CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                                     ctypes.c_uint64(device_ptr))
    if r != 0:
        raise WeightbeamError(
            f"cuPointerGetAttribute(IS_LEGACY_CUDA_IPC_CAPABLE) failed with CUresult {r}",
            "INTERNAL")
    if not legacy_ipc.value:
        pool = ctypes.c_void_p(0)
        from_pool = driver.cuPointerGetAttribute(ctypes.byref(pool),
                                                 _CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
                                                 ctypes.c_uint64(device_ptr)) == 0 and bool(
                                                     pool.value)
        raise WeightbeamError(not_ipc_capable_message(device_ptr, attr.device, from_pool),
                              "FAILED_PRECONDITION")
    uuid, bus_id = device_identity(attr.device)
    # The calling thread's context is put back afterwards, none included: cudaSetDevice back to
    # "device 0" would create a context on GPU 0 in a thread that never had one.
    previous = ctypes.c_void_p(0)
    r = driver.cuCtxGetCurrent(ctypes.byref(previous))
    if r != 0:
        raise WeightbeamError(f"cuCtxGetCurrent failed with CUresult {r}", "INTERNAL")
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
        return handle.raw, offset, attr.device, uuid, bus_id
    finally:
        driver.cuCtxSetCurrent(previous)


def synchronize_device(device):
    """Waits until every stream of this process on cuda:``device`` is idle (the writes of the
    optimizer step included): cudaDeviceSynchronize with that device current."""
    cudart, driver = _load()
    previous = ctypes.c_void_p(0)
    driver.cuCtxGetCurrent(ctypes.byref(previous))
    _check(cudart, cudart.cudaSetDevice(int(device)), f"cudaSetDevice({device})")
    try:
        _check(cudart, cudart.cudaDeviceSynchronize(), f"cudaDeviceSynchronize on cuda:{device}")
    finally:
        driver.cuCtxSetCurrent(previous)
