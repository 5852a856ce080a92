"""MXFP4 for the demo model's experts, in torch: the quantiser (``mxfp4_quantize``), packing into
the released gpt-oss ``*_blocks`` / ``*_scales`` bytes (``mxfp4_pack``), and the straight-through
fake quantisation used for quantisation-aware training and MXFP4 evaluation.

Pure tensor code: it must not read or write files, nor know about models or layers (export.py and
gpt_oss_model.py apply it).  Decoding is transformers' ``convert_moe_packed_tensors``, not ours.
It is deliberately not shared with tools/reference/mxfp4.py: that numpy encoder always takes the
smallest exponent that fits, while this one picks each block's exponent from two candidates by
squared error, so the two encode differently, and either change would alter bytes that are
committed (tests/fixtures/gpt-oss-mxfp4, models/rust-docs-gpt-oss).
"""

import torch


# E2M1 magnitudes and the rounding boundaries between them (ties go to the smaller).
FP4_POS = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
FP4_BOUNDS = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]


def mxfp4_quantize(w: torch.Tensor):
    """Quantize ``w [..., rows, cols]`` (cols % 32 == 0) in 32-wide blocks along cols.

    Returns (codes uint8 [..., rows, cols/32, 32], exps int32 [..., rows, cols/32],
    dequantized float32 [..., rows, cols]). Per block the shared exponent is either
    e = the smallest with max|x| / 2^e <= 6 or e - 1 (the largest values then clip
    to 6), whichever gives the smaller squared error; each value is rounded to the
    nearest E2M1 value (ties to the smaller magnitude), sign in bit 3.
    """
    x = w.detach().float()
    *pre, rows, cols = x.shape
    assert cols % 32 == 0, x.shape
    x = x.reshape(*pre, rows, cols // 32, 32)
    amax = x.abs().amax(-1)
    pos = torch.tensor(FP4_POS, device=x.device)
    bounds = torch.tensor(FP4_BOUNDS, device=x.device)
    safe = torch.where(amax > 0, amax, torch.ones_like(amax))
    e = torch.ceil(torch.log2(safe / 6.0)).to(torch.int32)
    # exact fix-ups against log2 rounding
    e = torch.where(safe / torch.exp2(e.float()) > 6.0, e + 1, e)
    e = torch.where(safe / torch.exp2((e - 1).float()) <= 6.0, e - 1, e)
    e = torch.where(amax > 0, e, torch.full_like(e, -127)).clamp(-127, 127)

    def encode(exp):
        y = x / torch.exp2(exp.float())[..., None]
        mag = torch.bucketize(y.abs().contiguous(), bounds, right=False)  # 0..7, > 5 -> 7 (clips to 6)
        codes = mag | torch.where(torch.signbit(y), 8, 0)
        deq = torch.where(torch.signbit(y), -pos[mag], pos[mag]) * torch.exp2(exp.float())[..., None]
        return codes.to(torch.uint8), deq

    c_hi, d_hi = encode(e)
    e_lo = (e - 1).clamp(min=-127)
    c_lo, d_lo = encode(e_lo)
    err_hi = (d_hi - x).pow(2).sum(-1)
    err_lo = (d_lo - x).pow(2).sum(-1)
    use_lo = (err_lo < err_hi) & (e > -127)
    codes = torch.where(use_lo[..., None], c_lo, c_hi)
    exps = torch.where(use_lo, e_lo, e)
    deq = torch.where(use_lo[..., None], d_lo, d_hi)
    return codes, exps, deq.reshape(*pre, rows, cols)


def mxfp4_pack(w_xw: torch.Tensor):
    """Expert parameter in transformers' x @ W layout [E, in, out] -> released
    (blocks uint8 [E, out, in/32, 16], scales uint8 [E, out, in/32])."""
    codes, exps, _ = mxfp4_quantize(w_xw.transpose(1, 2))
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)  # low nibble = even element
    scales = (exps + 127).to(torch.uint8)
    return blocks.contiguous(), scales.contiguous()


def mxfp4_fake_quant_xw(w_xw: torch.Tensor) -> torch.Tensor:
    """Value of the expert weight after an MXFP4 round trip, with a straight-through
    gradient (used for quantization-aware training and for evaluating in MXFP4)."""
    _, _, deq = mxfp4_quantize(w_xw.transpose(1, 2))
    deq = deq.transpose(1, 2).to(w_xw.dtype)
    return w_xw + (deq - w_xw).detach()
