"""An independent NumPy model of weightbeam's BF16 -> FP8 e4m3fn block quantiser, as documented
in daemon/transform/transform.h: per 128x128 block, scale = amax / 448 in float32 (1.0 for a
block with no nonzero finite value), q = x / scale in float32, rounded to nearest even e4m3fn and
saturated to +-448."""

import numpy as np

BLOCK = 128
_CODES = np.arange(0x7f)  # positive finite e4m3fn codes 0x00..0x7e, ascending in value
_VALUES = np.where(_CODES >> 3 == 0, (_CODES & 7) * 2.0**-9,
                   (1 + (_CODES & 7) / 8.0) * 2.0**((_CODES >> 3) - 7.0))


def encode_e4m3(q):
    """e4m3fn codes (uint8) of float32 values, round to nearest even, saturating; finite only."""
    a = np.abs(q.astype(np.float64))
    lo = np.clip(np.searchsorted(_VALUES, a, side="right") - 1, 0, len(_VALUES) - 1)
    hi = np.minimum(lo + 1, len(_VALUES) - 1)
    d_lo, d_hi = a - _VALUES[lo], _VALUES[hi] - a
    code = np.where((d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0)), hi, lo)
    code = np.where(a >= 448.0, 0x7e, code)
    return (code | np.where(np.signbit(q), 0x80, 0)).astype(np.uint8)


def quantize_fp8_blocks(x):
    """(codes uint8 like x, float32 scales of shape ceil(rows/128) x ceil(cols/128))."""
    x = np.asarray(x, dtype=np.float32)
    rows, cols = x.shape
    scales = np.ones(((rows + BLOCK - 1) // BLOCK, (cols + BLOCK - 1) // BLOCK), np.float32)
    codes = np.empty(x.shape, np.uint8)
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            block = x[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK]
            finite = np.abs(block[np.isfinite(block)])
            amax = finite.max() if finite.size else np.float32(0)
            scale = np.float32(amax) / np.float32(448) if amax > 0 else np.float32(1)
            scales[i, j] = scale
            codes[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK] = encode_e4m3(
                block / scale)
    return codes, scales
