"""SharedBuffer and dtype names, without daemons: what an agent would map is what the NumPy views
show, names are POSIX shm names, and mistakes are refused with messages that say what and where."""

import os
import unittest

import numpy as np

import weightbeam
from weightbeam import dtypes
from weightbeam.shared_buffer import find_buffer


class SharedBufferTest(unittest.TestCase):

    def test_views_write_the_shared_object_another_mapping_reads(self):
        with weightbeam.SharedBuffer(4096, "t") as buf:
            self.assertRegex(buf.shm_name, rf"^/wb-{os.getpid()}-t-\d+$")
            buf.array(np.float32, (2, 3), offset=128)[...] = [[1, 2, 3], [4, 5, 6]]
            with open("/dev/shm" + buf.shm_name, "rb") as f:  # as the agent's shm_open sees it
                f.seek(128)
                got = np.frombuffer(f.read(24), dtype=np.float32)
            np.testing.assert_array_equal(got, [1, 2, 3, 4, 5, 6])

    def test_close_unlinks_the_name_even_while_views_live(self):
        buf = weightbeam.SharedBuffer(64)
        view = buf.array(np.uint8, (64,))
        buf.close()
        self.assertFalse(os.path.exists("/dev/shm" + buf.shm_name))
        view[0] = 1  # the mapping stays valid for the view
        with self.assertRaises(weightbeam.WeightbeamError) as caught:
            buf.array(np.uint8, (1,))
        self.assertEqual(str(caught.exception), f"shared buffer {buf.shm_name} is closed")

    def test_a_view_past_the_end_is_refused(self):
        with weightbeam.SharedBuffer(100) as buf:
            with self.assertRaises(weightbeam.WeightbeamError) as caught:
                buf.array(np.uint16, (10,), offset=90)
            self.assertEqual(str(caught.exception),
                             f"shared buffer {buf.shm_name} holds 100 bytes, too small for "
                             "offset 90 + length 20")

    def test_find_buffer_locates_a_view_and_its_offset(self):
        with weightbeam.SharedBuffer(1 << 16) as a, weightbeam.SharedBuffer(1 << 16) as b:
            view = b.array(np.int64, (4, 4), offset=4096)
            found, offset = find_buffer(view.__array_interface__["data"][0], view.nbytes)
            self.assertIs(found, b)
            self.assertEqual(offset, 4096)
            self.assertEqual(find_buffer(a.address + a.nbytes - 8, 16), (None, None))

    def test_dtype_names(self):
        types = dtypes.types_pb2
        self.assertEqual(dtypes.to_dtype("bf16"), types.DTYPE_BF16)
        self.assertEqual(dtypes.to_dtype("bfloat16"), types.DTYPE_BF16)
        self.assertEqual(dtypes.to_dtype(np.float16), types.DTYPE_F16)
        self.assertEqual(dtypes.to_dtype(np.dtype("int64")), types.DTYPE_I64)
        self.assertEqual(dtypes.to_dtype(types.DTYPE_F8_E4M3), types.DTYPE_F8_E4M3)
        with self.assertRaises(ValueError) as caught:
            dtypes.to_dtype(np.complex64)
        self.assertIn("complex64", str(caught.exception))


if __name__ == "__main__":
    unittest.main()
