"""weightbeam DType values <-> torch dtypes, for the vLLM backend (torch 2.x)."""

import torch

from weightbeam import _stubs

_types = _stubs.types_pb2

TORCH_OF = {
    _types.DTYPE_F32: torch.float32, _types.DTYPE_F16: torch.float16,
    _types.DTYPE_BF16: torch.bfloat16, _types.DTYPE_F8_E4M3: torch.float8_e4m3fn,
    _types.DTYPE_I32: torch.int32, _types.DTYPE_I64: torch.int64, _types.DTYPE_U8: torch.uint8,
}

NAME_OF = {
    _types.DTYPE_F32: "f32", _types.DTYPE_F16: "f16", _types.DTYPE_BF16: "bf16",
    _types.DTYPE_F8_E4M3: "f8_e4m3", _types.DTYPE_I32: "i32", _types.DTYPE_I64: "i64",
    _types.DTYPE_U8: "u8",
}


def torch_dtype(dtype):
    return TORCH_OF[dtype]
