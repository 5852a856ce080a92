#!/usr/bin/env python3
"""What a GEMV launch pays when its code is no longer in the SMs'
instruction caches. Run on the GPU machine from the repository root:
`python3 tools/gpu/icache_probe.py` (torch, NVRTC and the driver through
ctypes, as qx_probe.py).

The question comes from the twentieth and twenty-first sessions: code a
launch never executes, placed between the x rounding and the main loop,
cost a decode step 2.5-5% while the kernel timed alone did not change,
and giving each launch a form of its own (less code, more kernels) did not
pay either. In a decode step every launch follows other kernels' code; in
qx_probe.py's graphs it follows itself.

So this probe times the engine's int4 GEMV (gemv_q4_qx, Llama-8B's o and
down launches with their residual add) in a CUDA graph where every launch
follows a "flusher": a kernel of N KB of straight-line code that every SM
executes once. A launch's cold-code cost is then
    T(gemv, flusher, gemv, flusher, ...) - T(flushers alone) - T(gemvs alone),
a launch, for each N. The flusher touches no memory, so L2 keeps what it
held (weights: each launch reads its own copy, as in qx_probe.py).
"""
import ctypes
import math
import os
import tempfile

import torch

from qx_probe import Segs, build, engine_geometry
from ring_probe import Kernels, timed

# Flusher sizes, KB of code (16 bytes an instruction).
SIZES_KB = [0, 16, 32, 64, 128, 256, 512]


def flusher_source(kb):
    """One kernel a size: a dependent FMA chain of kb * 64 instructions,
    each a volatile asm statement so that ptxas neither folds nor loops it."""
    lines = "".join('    asm volatile("fma.rn.f32 %0, %0, %1, 0f3F800000;" : "+f"(v) : "f"(a));\n'
                    for _ in range(kb * 64))
    return (f'extern "C" __global__ void flush_{kb}(float* out, float a) {{\n'
            "    float v = threadIdx.x;\n" + lines +
            "    if (v == 12345.0f) out[0] = v;\n}\n")


def flushers():
    """The flusher kernels of SIZES_KB, one module (compiled from a
    temporary file, as ring_probe's Kernels takes sources)."""
    path = os.path.join(tempfile.mkdtemp(prefix="icache_"), "flush.cu")
    with open(path, "w") as f:
        f.write("".join(flusher_source(kb) for kb in SIZES_KB))
    return Kernels([path], tuple(f"flush_{kb}".encode() for kb in SIZES_KB))


def main():
    gemv = build()
    fl = flushers()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    sink = torch.zeros(1, device="cuda")
    u32, u64 = ctypes.c_uint32, ctypes.c_uint64
    # name, k, m (one segment, residual add)
    for name, k, m in [("o + residual add", 4096, 4096), ("down + residual add", 14336, 4096)]:
        nbytes = m * k // 2 + m * k // 32 * 2
        copies = max(2, math.ceil(300e6 / nbytes))
        mats = [(torch.randint(0, 256, (m, k // 2), dtype=torch.uint8, device="cuda"),
                 (torch.rand(m, k // 32, device="cuda") * 0.02 + 0.001).half())
                for _ in range(copies)]
        x = torch.randn(k, device="cuda")
        out = torch.zeros(m, device="cuda")
        wpr, grid = engine_geometry(m, k)

        def launch_gemv(i):
            c, s = mats[i % copies]
            sg = Segs()
            sg.w[0], sg.scales[0], sg.out[0], sg.m[0] = c.data_ptr(), s.data_ptr(), out.data_ptr(), m
            sg.count, sg.accumulate = 1, 1
            gemv.launch("gemv_q4_qx", (1, grid), 256, k + k // 32 * 4,
                        [sg, u64(x.data_ptr()), ctypes.c_int32(0), u64(0), u32(1), u32(1), u32(k),
                         u32(wpr)])

        def launch_flush(kb):
            # Two blocks an SM's worth, one warp each: every SM runs it.
            fl.launch(f"flush_{kb}", 2 * sms, 32, 0, [u64(sink.data_ptr()), ctypes.c_float(1.0)])

        alone = min(timed(gemv, launch_gemv) for _ in range(2))
        print(f"{name}: {m}x{k}, wpr {wpr} grid {grid}: {alone:.2f} µs a launch alone", flush=True)
        for kb in SIZES_KB:
            f_alone = min(timed(fl, lambda i: launch_flush(kb)) for _ in range(2))

            def both(i):
                launch_gemv(i)
                launch_flush(kb)
            pair = min(timed(gemv, both) for _ in range(2))
            print(f"  flusher {kb:4d} KB: flusher {f_alone:7.2f} µs, pair {pair:7.2f} µs, "
                  f"cold-code cost {pair - f_alone - alone:+.2f} µs", flush=True)
        mats.clear()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
