"""weightbeam.cuda_ipc without a GPU: the ctypes cudaPointerAttributes against the CUDA header
the build uses (a small C program prints sizeof / offsetof; skipped without a compiler or the
header), the order in which libcudart is looked for, and get_ipc_handle against a fake runtime
and driver: the device's UUID and PCI bus id are sent, and VMM / pool memory is refused with the
allocator setting to change."""

import ctypes
import os
import shutil
import subprocess
import tempfile
import unittest

from weightbeam import cuda_ipc
from weightbeam.errors import WeightbeamError

CUDA_ROOT = os.environ.get("WB_CUDA_ROOT", "/usr/local/cuda")
HEADER = os.path.join(CUDA_ROOT, "include", "cuda_runtime_api.h")

PROGRAM = r"""
#include <stddef.h>
#include <stdio.h>
#include <cuda_runtime_api.h>
int main(void) {
  printf("%zu %zu %zu %zu %zu %zu\n", sizeof(struct cudaPointerAttributes),
         offsetof(struct cudaPointerAttributes, type),
         offsetof(struct cudaPointerAttributes, device),
         offsetof(struct cudaPointerAttributes, devicePointer),
         offsetof(struct cudaPointerAttributes, hostPointer), sizeof(cudaIpcMemHandle_t));
  return 0;
}
"""


class PointerAttributesLayout(unittest.TestCase):
    def test_ctypes_struct_matches_the_header(self):
        cc = shutil.which("cc") or shutil.which("gcc")
        if cc is None or not os.path.exists(HEADER):
            self.skipTest(f"no C compiler or no {HEADER}")
        with tempfile.TemporaryDirectory() as tmp:
            src, exe = os.path.join(tmp, "layout.c"), os.path.join(tmp, "layout")
            with open(src, "w") as f:
                f.write(PROGRAM)
            subprocess.run([cc, "-I", os.path.dirname(HEADER), src, "-o", exe], check=True)
            out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
        size, off_type, off_device, off_dptr, off_hptr, ipc = map(int, out.split())
        A = cuda_ipc._PointerAttributes
        self.assertEqual(ctypes.sizeof(A), size, "sizeof(cudaPointerAttributes)")
        self.assertEqual(A.type.offset, off_type)
        self.assertEqual(A.device.offset, off_device)
        self.assertEqual(A.devicePointer.offset, off_dptr)
        self.assertEqual(A.hostPointer.offset, off_hptr)
        self.assertEqual(cuda_ipc.IPC_HANDLE_BYTES, ipc)


class LoaderOrder(unittest.TestCase):
    def test_the_runtime_already_loaded_comes_first_and_the_dev_name_last(self):
        torch = type("torch", (), {"__file__": "/opt/venv/site-packages/torch/__init__.py"})
        loaded = ["/opt/venv/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12"]
        c = cuda_ipc._candidates(loaded=loaded, modules={"torch": torch}, search_path=[])
        self.assertEqual(c[0], loaded[0])
        self.assertEqual(c[-1], "libcudart.so")
        self.assertLess(c.index("libcudart.so.13"), c.index("libcudart.so"))
        self.assertEqual(len(c), len(set(c)))

    def test_loaded_cudart_comes_from_the_process_maps(self):
        with tempfile.TemporaryDirectory() as tmp:
            lib = os.path.join(tmp, "libcudart.so.12")
            open(lib, "w").close()
            maps = os.path.join(tmp, "maps")
            with open(maps, "w") as f:
                f.write("7f00-7f01 r-xp 00000000 08:01 1234 /usr/lib/libc.so.6\n"
                        f"7f02-7f03 r-xp 00000000 08:01 1235 {lib}\n"
                        f"7f03-7f04 r--p 00001000 08:01 1235 {lib}\n"
                        "7f05-7f06 rw-p 00000000 00:00 0\n")
            self.assertEqual(cuda_ipc._loaded_cudart(maps), [lib])
        self.assertEqual(cuda_ipc._loaded_cudart("/nonexistent/maps"), [])


class FakeCudart:
    """The runtime calls get_ipc_handle makes; one device-memory allocation on cuda:1."""

    def __init__(self):
        self.current = 0
        self.sets = []

    def cudaPointerGetAttributes(self, attr_ref, ptr):
        attr = attr_ref._obj
        attr.type, attr.device = 2, 1
        return 0

    def cudaGetDevice(self, ref):
        ref._obj.value = self.current
        return 0

    def cudaSetDevice(self, device):
        self.sets.append(device)
        self.current = device
        return 0

    def cudaDeviceGetPCIBusId(self, buf, n, device):
        ctypes.memmove(buf, b"0000:65:00.0\0", 13)
        return 0

    def cudaIpcGetMemHandle(self, handle, base):
        ctypes.memmove(handle, b"H" * 64, 64)
        return 0

    def cudaGetLastError(self):
        return 0

    def cudaGetErrorName(self, err):
        return b"cudaErrorFake"

    def cudaGetErrorString(self, err):
        return b"fake"


class FakeDriver:
    def __init__(self, legacy_ipc=1, pool=0):
        self.legacy_ipc, self.pool = legacy_ipc, pool
        self.context_restored = None

    def cuPointerGetAttribute(self, out_ref, attribute, ptr):
        if attribute == 10:
            out_ref._obj.value = self.legacy_ipc
        elif attribute == 17:
            out_ref._obj.value = self.pool
        return 0

    def cuDeviceGet(self, ref, ordinal):
        ref._obj.value = getattr(ordinal, "value", ordinal)
        return 0

    def cuDeviceGetUuid_v2(self, uuid_ref, dev):
        for i in range(16):
            uuid_ref._obj.bytes[i] = 0xA0 + i if i % 3 else 0  # zero bytes inside, too
        return 0

    def cuCtxGetCurrent(self, ref):
        ref._obj.value = None  # this thread had no context
        return 0

    def cuCtxSetCurrent(self, ctx):
        self.context_restored = ctx
        return 0

    def cuMemGetAddressRange_v2(self, base_ref, size_ref, ptr):
        base_ref._obj.value = 0x7000_0000
        size_ref._obj.value = 1 << 20
        return 0


class GetIpcHandleWithFakeCuda(unittest.TestCase):
    def setUp(self):
        self.saved = cuda_ipc._libs

    def tearDown(self):
        cuda_ipc._libs = self.saved

    def test_the_device_is_named_by_uuid_and_pci_bus_id(self):
        rt, drv = FakeCudart(), FakeDriver()
        cuda_ipc._libs = (rt, drv)
        handle, offset, device, uuid, bus_id = cuda_ipc.get_ipc_handle(0x7000_1000, 4096)
        self.assertEqual(handle, b"H" * 64)
        self.assertEqual(offset, 0x1000)
        self.assertEqual(device, 1)
        self.assertEqual(uuid, bytes(0xA0 + i if i % 3 else 0 for i in range(16)))
        self.assertEqual(len(uuid), 16)
        self.assertEqual(bus_id, "0000:65:00.0")
        # The thread's (empty) context is put back, not "device 0" set current.
        self.assertEqual(rt.sets, [1])
        self.assertIsNone(drv.context_restored.value)

    def test_vmm_memory_is_refused_naming_the_allocator_setting(self):
        cuda_ipc._libs = (FakeCudart(), FakeDriver(legacy_ipc=0))
        with self.assertRaises(WeightbeamError) as caught:
            cuda_ipc.get_ipc_handle(0x7000_1000, 4096)
        message = str(caught.exception)
        self.assertIn("virtual-memory (cuMemCreate) mapping", message)
        self.assertIn("expandable_segments:True", message)
        self.assertIn("enable_sleep_mode=False", message)
        self.assertEqual(caught.exception.code, "FAILED_PRECONDITION")

    def test_pool_memory_is_refused_as_stream_ordered(self):
        cuda_ipc._libs = (FakeCudart(), FakeDriver(legacy_ipc=0, pool=0x1234))
        with self.assertRaises(WeightbeamError) as caught:
            cuda_ipc.get_ipc_handle(0x7000_1000, 4096)
        self.assertIn("stream-ordered memory (cudaMallocAsync", str(caught.exception))
        self.assertIn("backend:cudaMallocAsync", str(caught.exception))


if __name__ == "__main__":
    unittest.main()
