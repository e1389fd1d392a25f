"""./wb gpu-check's python-cuda-ipc row: the Python client's CUDA IPC export on a real GPU.

Allocates device memory with cudaMalloc through ctypes, exports an interior range with
weightbeam.cuda_ipc.get_ipc_handle, and has the C++ ipc_open_helper (another process, given a
deliberately wrong ordinal and the device's UUID) open it and hash the bytes. Then checks that
cudaMallocAsync memory is refused with the allocator advice, as the driver reports it.

  python_ipc_check.py IPC_OPEN_HELPER        exit 0 pass, 1 fail, 3 no usable GPU
"""

import ctypes
import subprocess
import sys

from weightbeam import cuda_ipc
from weightbeam.errors import WeightbeamError


def fnv1a(data):
    h = 1469598103934665603
    for b in data:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def main(helper):
    try:
        cudart, _ = cuda_ipc._load()
    except WeightbeamError as e:
        print(f"skipped: {e}")
        return 3
    count = ctypes.c_int(0)
    if cudart.cudaGetDeviceCount(ctypes.byref(count)) != 0 or count.value == 0:
        print("skipped: no CUDA device")
        return 3
    size = 1 << 20
    data = bytes(i * 7 % 256 for i in range(size))
    ptr = ctypes.c_void_p(0)
    assert cudart.cudaSetDevice(0) == 0
    assert cudart.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(size)) == 0, "cudaMalloc"
    assert cudart.cudaMemcpy(ptr, data, ctypes.c_size_t(size), 1) == 0, "cudaMemcpy"
    handle, offset, device, uuid, bus_id = cuda_ipc.get_ipc_handle(ptr.value + 4096, 1000)
    ok = offset == 4096 and len(uuid) == 16 and bus_id != ""
    out = subprocess.run([helper, handle.hex(), str(offset), "1000", str(device + 5), uuid.hex()],
                         capture_output=True, text=True)
    fields = out.stdout.split()
    ok = ok and out.returncode == 0 and len(fields) == 2 and int(fields[0]) == fnv1a(
        data[4096:5096])
    print(f"export + open in another process: {'ok' if ok else 'FAILED'} "
          f"(cuda:{device} {bus_id}; helper: {out.stdout.strip()} {out.stderr.strip()})")

    pooled = ctypes.c_void_p(0)
    refused = False
    if cudart.cudaMallocAsync(ctypes.byref(pooled), ctypes.c_size_t(size), None) == 0:
        cudart.cudaDeviceSynchronize()
        try:
            cuda_ipc.get_ipc_handle(pooled.value, 1000)
        except WeightbeamError as e:
            refused = "stream-ordered" in str(e) and "cudaMallocAsync" in str(e)
            print(f"cudaMallocAsync memory refused: {e}")
        cudart.cudaFreeAsync(pooled, None)
    print(f"pool memory refusal: {'ok' if refused else 'FAILED'}")
    cudart.cudaFree(ptr)
    return 0 if ok and refused else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
