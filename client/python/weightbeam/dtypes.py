"""Element types: weightbeam's DType from a name ("bf16"), a NumPy dtype or a torch dtype."""

import numpy as np

from weightbeam import _stubs

types_pb2 = _stubs.types_pb2

_BY_NAME = {
    "f32": types_pb2.DTYPE_F32, "float32": types_pb2.DTYPE_F32,
    "f16": types_pb2.DTYPE_F16, "float16": types_pb2.DTYPE_F16,
    "bf16": types_pb2.DTYPE_BF16, "bfloat16": types_pb2.DTYPE_BF16,
    "f8_e4m3": types_pb2.DTYPE_F8_E4M3, "float8_e4m3fn": types_pb2.DTYPE_F8_E4M3,
    "i32": types_pb2.DTYPE_I32, "int32": types_pb2.DTYPE_I32,
    "i64": types_pb2.DTYPE_I64, "int64": types_pb2.DTYPE_I64,
    "u8": types_pb2.DTYPE_U8, "uint8": types_pb2.DTYPE_U8,
}

_SIZES = {
    types_pb2.DTYPE_F32: 4, types_pb2.DTYPE_F16: 2, types_pb2.DTYPE_BF16: 2,
    types_pb2.DTYPE_F8_E4M3: 1, types_pb2.DTYPE_I32: 4, types_pb2.DTYPE_I64: 8,
    types_pb2.DTYPE_U8: 1,
}


def to_dtype(dtype):
    """The DType enum value for ``dtype``: "bf16"/"bfloat16", np.float32, torch.bfloat16, or an
    enum value itself. NumPy has no bfloat16: hold BF16 data as uint16 and pass "bf16"."""
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        return dtype  # already a DType value; the agent checks it
    if isinstance(dtype, str):
        key = dtype.lower()
    elif type(dtype).__module__ == "torch":
        key = str(dtype).split(".", 1)[-1]  # "torch.bfloat16" -> "bfloat16"
    else:
        try:
            key = np.dtype(dtype).name
        except TypeError:
            key = str(dtype)
    if key not in _BY_NAME:
        raise ValueError(
            f"dtype {dtype!r} is not one weightbeam moves (f32, f16, bf16, f8_e4m3, i32, i64, u8)")
    return _BY_NAME[key]


def itemsize(dtype):
    """Bytes per element of a DType value (0 for an unknown one)."""
    return _SIZES.get(dtype, 0)
