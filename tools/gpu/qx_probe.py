#!/usr/bin/env python3
"""The engine's int4 integer-activation GEMV (gemv_q4_qx) alone, on
Llama-3.1-8B's decode launches, in each configuration the engine uses:
one matrix; q/k/v as three segments through a fused RMSNorm; gate and up as
two segments with the SiLU product written by the gate's warp (GLU_SEGS)
through the norm; o and down adding into the residual stream. Run on the GPU
machine from the repository root: `python3 tools/gpu/qx_probe.py` (torch
for memory and events, NVRTC and the driver through ctypes, as
ring_probe.py).

Each configuration is checked against torch's product on the same rounding
of x (int8 codes a 32-value group; the sums exact in integers), then timed:
microseconds a launch, from a CUDA graph of launches each on its own copy of
the weights so that L2 does not hold them, and the weight bytes' rate.

`--against DIR` also builds the kernels from DIR (another checkout's
crates/turbospark-cuda/kernels) and times both, alternating, twice each.
`--variant NAME` does the same with this tree's kernels changed in one
place, to price a part of the launch (their outputs are wrong by design):
  noread  x's loads in the rounding replaced by constants (the rounding and
          its stores stay): what reading x from L2 costs every block;
  nox     no rounding at all (the codes left as shared memory holds them):
          the whole x prologue.
"""
import ctypes
import math
import os
import shutil
import sys
import tempfile

import torch

sys.path.insert(0, "tools/gpu")
from ring_probe import Kernels, timed  # noqa: E402

KERNELS = "crates/turbospark-cuda/kernels"
SOURCES = [f"{KERNELS}/common.cuh", f"{KERNELS}/gemv_common.cuh",
           f"{KERNELS}/grouped_formats.cuh", f"{KERNELS}/gemv_grouped.cu"]
RESIDENT = 2 * 132


class Segs(ctypes.Structure):
    """kernels/gemv_common.cuh's GemvSegs."""
    _fields_ = [("w", ctypes.c_uint64 * 3), ("scales", ctypes.c_uint64 * 3),
                ("bias", ctypes.c_uint64 * 3), ("out", ctypes.c_uint64 * 3),
                ("m", ctypes.c_uint32 * 3), ("count", ctypes.c_uint32),
                ("norm", ctypes.c_uint64), ("normed", ctypes.c_uint64),
                ("norm_dt", ctypes.c_int32), ("eps", ctypes.c_float),
                ("accumulate", ctypes.c_uint32), ("glu", ctypes.c_int32),
                ("glu_alpha", ctypes.c_float), ("glu_limit", ctypes.c_float)]


def build(kernels=KERNELS):
    """gemv_q4_qx from the kernel sources in `kernels`."""
    return Kernels([f.replace(KERNELS, kernels) for f in SOURCES], (b"gemv_q4_qx",))


# --variant: (file, text of this tree, what replaces it).
VARIANTS = {
    "noread": ("grouped_formats.cuh",
               """                lo[r] = ((const float4*)xr)[2 * c];
                hi[r] = ((const float4*)xr)[2 * c + 1];
                if (norm) load_w8(norm, norm_dt, 8 * c, nw[r]);""",
               """                lo[r] = make_float4(1.0f + c, 2.0f, -3.0f, 4.0f);
                hi[r] = make_float4(0.5f, -2.0f, 3.0f, 1.5f * c);
                if (norm) { for (int i = 0; i < 8; i++) nw[r][i] = 1.0f; }"""),
    "nox": ("grouped_formats.cuh",
            "    if (sg.norm) return quantize_rounds<F, 4>",
            "    return 1.0f;\n    if (sg.norm) return quantize_rounds<F, 4>"),
}


def build_variant(name):
    """This tree's kernels with VARIANTS[name] applied, in a temporary
    folder (exits if the tree's text has changed under it)."""
    file, old, new = VARIANTS[name]
    folder = tempfile.mkdtemp(prefix=f"qx_{name}_")
    for f in os.listdir(KERNELS):
        shutil.copy(os.path.join(KERNELS, f), folder)
    path = os.path.join(folder, file)
    text = open(path).read()
    if old not in text:
        sys.exit(f"--variant {name}: {file} no longer holds the text it replaces")
    open(path, "w").write(text.replace(old, new, 1))
    return build(folder)


def engine_geometry(m, k, glu=False):
    """src/gemv.rs: qx_warps_cap, qx_max_wpr, persistent_geometry (GR 4)."""
    cap = 1 << int(math.log2(max(1, k // 32 // 64)))
    if glu:
        cap = min(cap, 4)
    blocks_at_one = math.ceil(m / 32)
    max_wpr = 1 if blocks_at_one > RESIDENT else cap

    def busy(w):
        work = math.ceil(m / (8 // w * 4))
        return work / (math.ceil(work / RESIDENT) * RESIDENT)
    ws = [w for w in (1, 2, 4, 8) if w <= max(1, max_wpr)]
    wpr = next((w for w in ws if busy(w) >= 0.9), max(ws, key=busy))
    blocks = math.ceil(m / (8 // wpr * 4))
    return wpr, math.ceil(blocks / math.ceil(blocks / RESIDENT))


GLU_SEGS_SILU = 3
# name, k, segment heights, fused norm, SiLU of two segments, residual add
CONFIGS = [
    ("q+k+v, one matrix", 4096, [6144], False, False, False),
    ("q+k+v, three segments", 4096, [4096, 1024, 1024], False, False, False),
    ("q+k+v, three segments + norm (engine)", 4096, [4096, 1024, 1024], True, False, False),
    ("o, one matrix", 4096, [4096], False, False, False),
    ("o + residual add (engine)", 4096, [4096], False, False, True),
    ("gate+up, one matrix", 4096, [28672], False, False, False),
    ("gate+up, two segments", 4096, [14336, 14336], False, False, False),
    ("gate+up, one matrix + norm", 4096, [28672], True, False, False),
    ("gate+up, two segments + SiLU", 4096, [14336, 14336], False, True, False),
    ("gate+up, two segments + SiLU + norm (engine)", 4096, [14336, 14336], True, True, False),
    ("down, one matrix", 14336, [4096], False, False, False),
    ("down + residual add (engine)", 14336, [4096], False, False, True),
    ("lm_head, one matrix", 4096, [128256], False, False, False),
    # Almost no weights: what a launch costs beside its bytes (x rounded
    # by every block, one round trip, the store), at o's and down's widths.
    ("64 rows at o's width", 4096, [64], False, False, False),
    ("64 rows at down's width", 14336, [64], False, False, False),
    ("64 rows at o's width + norm", 4096, [64], True, False, False),
]


def rounded(x):
    """x as the kernels round it: codes and steps per 32 values."""
    xg = x.view(-1, 32)
    amax = xg.abs().amax(dim=1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))  # f32, as the kernel
    return (torch.round(xg * inv).double() * (amax * (1.0 / 127.0)).double()).view(-1)


def dequant(codes, scales):
    m = codes.shape[0]
    lo, hi = (codes & 0x0F).double(), (codes >> 4).double()
    q = torch.stack([lo, hi], dim=-1).view(m, -1, 32) - 8.0
    return (q * scales.double().unsqueeze(-1)).view(m, -1)


def main():
    builds = [("this tree", build())]
    if "--against" in sys.argv:
        other = sys.argv[sys.argv.index("--against") + 1]
        builds.append((other, build(other)))
    if "--variant" in sys.argv:
        name = sys.argv[sys.argv.index("--variant") + 1]
        builds.append((f"variant {name}", build_variant(name)))
    torch.manual_seed(0)
    u32, u64 = ctypes.c_uint32, ctypes.c_uint64
    for name, k, heights, norm, glu, accumulate in CONFIGS:
        m = sum(heights)
        nbytes = m * k // 2 + m * k // 32 * 2
        copies = max(2, math.ceil(300e6 / nbytes))
        mats = [[(torch.randint(0, 256, (h, k // 2), dtype=torch.uint8, device="cuda"),
                  (torch.rand(h, k // 32, device="cuda") * 0.02 + 0.001).half()) for h in heights]
                for _ in range(copies)]
        x = torch.randn(k, device="cuda")
        nw = (torch.rand(k, device="cuda") + 0.5).bfloat16()
        outs = [torch.zeros(h, device="cuda") for h in heights]
        start = [torch.randn(h, device="cuda") for h in heights]
        # The reference: x through the norm (the kernel rounds w · x and
        # scales the sums by r), each segment's product, then SiLU or the add.
        xin = x * nw.float() if norm else x
        r = (1.0 / torch.sqrt((x.double() ** 2).mean() + 1e-5)).item() if norm else 1.0
        ys = [dequant(c, s) @ rounded(xin) * r for c, s in mats[0]]
        if glu:
            g = ys[0]
            ys = [g / (1.0 + torch.exp(-g)) * ys[1]]
        elif accumulate:
            ys = [y + st.double() for y, st in zip(ys, start)]

        def launch(i, wpr, grid, k_):
            sg = Segs()
            for s_, (c, sc) in enumerate(mats[i % copies]):
                sg.w[s_], sg.scales[s_] = c.data_ptr(), sc.data_ptr()
                sg.out[s_], sg.m[s_] = outs[s_].data_ptr(), heights[s_]
            sg.count = len(heights)
            if norm:
                sg.norm, sg.norm_dt, sg.eps = nw.data_ptr(), 1, 1e-5
            sg.accumulate = int(accumulate)
            sg.glu = GLU_SEGS_SILU if glu else 0
            k_.launch("gemv_q4_qx", (1, grid), 256, k + k // 32 * 4,
                      [sg, u64(x.data_ptr()), ctypes.c_int32(0), u64(0), u32(1), u32(1), u32(k),
                       u32(wpr)])

        rows = sum(-(-h // 4) * 4 for h in heights)
        wpr, grid = engine_geometry(rows, k, glu)
        print(f"{name}: {m}x{k} ({nbytes / 1e6:.1f} MB) wpr {wpr} grid {grid}", flush=True)
        times = {b: [] for b, _ in builds}
        for rep in range(2 if len(builds) > 1 else 1):
            for b, k_ in builds:
                for o, st in zip(outs, start):
                    o.copy_(st)
                launch(0, wpr, grid, k_)
                torch.cuda.synchronize()
                err = max(((o[:y.numel()].double() - y).abs().max() / y.abs().max()).item()
                          for o, y in zip(outs, ys))
                t = timed(k_, lambda i: launch(i, wpr, grid, k_))
                times[b].append(t)
                if rep == 0:
                    print(f"  {b}: max|Δ|/max|ref| {err:.1e}", flush=True)
        for b, ts in times.items():
            print(f"  {b}: " + ", ".join(f"{t:.2f}" for t in ts) + f" µs, "
                  f"{nbytes / min(ts) / 1e6:.2f} TB/s", flush=True)
        mats.clear()  # frees the copies before the next configuration
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
