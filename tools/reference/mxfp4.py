"""MXFP4 (OCP microscaling FP4, as in the gpt-oss release) in numpy for the reference fixtures:
``mxfp4_encode`` (the scale rule the committed ``gpt-oss-mxfp4`` bytes were made with: the smallest
exponent that fits, values rounded to nearest) and ``mxfp4_decode`` (with the wrong-decoding
switches the mutations use).

Pure array code: no torch, no files, no model.  It is deliberately not shared with
tools/train-demo/mxfp4.py: that quantiser picks each block's scale from two candidates by squared
error (so it encodes differently) and works on torch tensors with a straight-through gradient;
changing either rule would change committed bytes.
"""

from __future__ import annotations

import numpy as np


# E2M1 code -> value; bit 3 is the sign (code 8 is -0.0).  Same table as transformers' FP4_VALUES.
FP4_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                      dtype=np.float32)
MXFP4_BLOCK = 32


def mxfp4_encode(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Quantize ``w [..., rows, cols]`` in blocks of 32 along cols.

    Returns ``blocks`` uint8 ``[..., rows, cols/32, 16]`` (value 2j of a block in the low nibble of
    byte j, value 2j+1 in the high nibble) and ``scales`` uint8 ``[..., rows, cols/32]`` (E8M0: the
    block's values are multiplied by 2^(scale - 127)).  The scale exponent is the smallest e with
    max|block| / 2^e <= 6; each value is rounded to the nearest E2M1 magnitude (ties to the smaller),
    keeping its sign bit, so small negative values become code 8 (-0.0).
    """
    x = w.astype(np.float64).reshape(*w.shape[:-1], -1, MXFP4_BLOCK)
    amax = np.abs(x).max(-1)
    with np.errstate(divide="ignore"):
        exp = np.where(amax > 0, np.ceil(np.log2(amax / 6.0)), -127.0)
    exp = np.clip(exp, -127, 127).astype(np.int32)
    y = x / np.exp2(exp)[..., None]
    assert np.abs(y).max() <= 6.0
    magnitude = np.abs(np.abs(y)[..., None] - FP4_VALUES[:8].astype(np.float64)).argmin(-1)
    codes = (magnitude | np.where(np.signbit(y), 8, 0)).astype(np.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks.astype(np.uint8), (exp + 127).astype(np.uint8)


def mxfp4_decode(blocks: np.ndarray, scales: np.ndarray, swap_nibbles: bool = False,
                 scale_bias: int = 127) -> np.ndarray:
    """``blocks [..., rows, G, 16]``, ``scales [..., rows, G]`` -> float32 ``[..., rows, G*32]``.
    The keyword arguments only exist to build the wrong decodings used as mutations."""
    lo, hi = blocks & 0x0F, blocks >> 4
    if swap_nibbles:
        lo, hi = hi, lo
    codes = np.stack([lo, hi], axis=-1).reshape(*blocks.shape[:-1], 2 * blocks.shape[-1])
    values = np.ldexp(FP4_VALUES[codes], (scales.astype(np.int32) - scale_bias)[..., None])
    return values.reshape(*blocks.shape[:-2], -1).astype(np.float32)
