#!/usr/bin/env python3
"""What separating two dependent phases of a decode step costs: a kernel
boundary (one launch a phase in a CUDA graph, with and without programmatic
dependent launch, as the engine's recorded step runs) against a grid-wide
barrier inside one persistent kernel (a cooperative launch of one block an
SM, as a single-kernel decode step would run). Run on the GPU machine from
the repository root: `python3 tools/gpu/barrier_probe.py` (torch for memory
and events, NVRTC and the driver through ctypes, as ring_probe.py).

Each phase reads a value another block wrote in the phase before and its
share of BYTES bytes of a buffer (a window a phase, so that L2 does not
hold them). Prints microseconds a phase for phases of 0 bytes (the bare
cost of the separation), 9.4 MB (Llama-8B int4's o projection) and 33 MB
(its down projection), and what the bytes alone would take at 3.9 TB/s.
The kernels are tools/gpu/barrier_probe.cu.
"""
import ctypes
import sys

import torch

sys.path.insert(0, "tools/gpu")
from ring_probe import Kernels  # noqa: E402

KERNELS = "crates/turbospark-cuda/kernels"
SOURCES = [f"{KERNELS}/common.cuh", "tools/gpu/barrier_probe.cu"]
PHASES = 64
THREADS = 256
WINDOWS = 8


class Attr(ctypes.Structure):
    """CUlaunchAttribute: an id, padding, a 64-byte value union."""
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_ubyte * 64)]


class Config(ctypes.Structure):
    """CUlaunchConfig."""
    _fields_ = [("gx", ctypes.c_uint), ("gy", ctypes.c_uint), ("gz", ctypes.c_uint),
                ("bx", ctypes.c_uint), ("by", ctypes.c_uint), ("bz", ctypes.c_uint),
                ("shared", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(Attr)), ("n", ctypes.c_uint)]


def params(args):
    vals = [a if isinstance(a, ctypes._SimpleCData) else ctypes.c_uint64(a) for a in args]
    ptrs = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p)
                                          for v in vals])
    return vals, ptrs


def launch_ex(k, name, grid, args, pdl):
    """cuLaunchKernelEx, with the programmatic-serialization attribute."""
    attr = Attr(id=6)  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value[0] = 1
    cfg = Config(grid, 1, 1, THREADS, 1, 1, 0, Kernels.stream(),
                 ctypes.pointer(attr) if pdl else None, 1 if pdl else 0)
    _, ptrs = params(args)
    k.check(k.cu.cuLaunchKernelEx(ctypes.byref(cfg), k.fns[name], ptrs, None), name)


def elapsed_us(run):
    """Best of five: microseconds of run() on the current stream."""
    best = float("inf")
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        torch.cuda.synchronize()
        best = min(best, a.elapsed_time(b) * 1e3)
    return best


def main():
    k = Kernels(SOURCES, (b"phase_kernel", b"phases_kernel"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    buf = torch.zeros(PHASES * sms, dtype=torch.float32, device="cuda")
    bar = torch.zeros(2, dtype=torch.int32, device="cuda")
    side = torch.cuda.Stream()
    print(f"{sms} blocks of {THREADS} threads, {PHASES} phases; µs a phase")
    for label, nbytes in [("0 bytes", 0), ("9.4 MB", 9_437_184), ("33 MB", 33_030_144)]:
        w = torch.empty(max(16, nbytes * WINDOWS), dtype=torch.uint8, device="cuda")
        wp = w.data_ptr()
        row = [label, f"bytes alone {nbytes / 3.9e6:.2f}"]
        with torch.cuda.stream(side):
            for pdl, pf in [(False, 0), (True, 0), (True, 1)]:
                def chain(i, pdl=pdl, pf=pf):
                    args = [buf.data_ptr(), ctypes.c_uint32(i), wp, ctypes.c_uint64(nbytes),
                            ctypes.c_uint32(WINDOWS), ctypes.c_uint32(pf)]
                    launch_ex(k, "phase_kernel", sms, args, pdl)
                exe = k.graph(chain, PHASES)
                us = elapsed_us(lambda: k.check(k.cu.cuGraphLaunch(exe, Kernels.stream()), "graph"))
                k.check(k.cu.cuGraphExecDestroy(exe), "cuGraphExecDestroy")
                row.append(f"launches{' + PDL' if pdl else ''}{' + prefetch' if pf else ''} "
                           f"{us / PHASES:.2f}")
            for pf in (0, 1):
                def persistent(pf=pf):
                    bar.zero_()
                    vals, ptrs = params([buf.data_ptr(), ctypes.c_uint32(PHASES), wp,
                                         ctypes.c_uint64(nbytes), ctypes.c_uint32(WINDOWS),
                                         bar.data_ptr(), ctypes.c_uint32(pf)])
                    k.check(k.cu.cuLaunchCooperativeKernel(
                        k.fns["phases_kernel"], sms, 1, 1, THREADS, 1, 1, 0,
                        Kernels.stream(), ptrs), "phases_kernel")
                us = elapsed_us(persistent)  # with a memset and one launch: ~0.1 µs a phase
                row.append(f"barriers{' + prefetch' if pf else ''} {us / PHASES:.2f}")
        print(" | ".join(row), flush=True)


if __name__ == "__main__":
    main()
