#!/usr/bin/env python3
"""Measures the bulk-copy ring of the streamed GEMVs in isolation (run on the
GPU machine from the repository root: `python3 tools/gpu/ring_probe.py`;
needs torch for memory and timing, NVRTC and the driver through ctypes).

Prints one line a configuration: microseconds a launch, the whole GPU's
read rate and each SM's. See ring_probe.cu for the question. `--quick` runs
the few configurations that decide the next design.

A launch's time is that of a CUDA graph of LAUNCHES launches divided by
their number (best of five): events around one launch issued from Python
also timed the host's launch (the first run read 47 µs for a launch of
about 5), and a graph leaves only the gaps between kernels, as the
engine's recorded decode step has them. Each launch of the graph reads its
own window of the buffer where the buffer holds enough, so that short
launches do not find their bytes in L2.
"""
import ctypes
import sys

import torch

from nvrtc_lib import compile_source, load_lib

# How a stage's copies are issued (ring_probe.cu's `issue`).
ISSUE = ["", " from lanes in turn", " in one instruction"]
KERNELS = "crates/turbospark-cuda/kernels"
SOURCES = [f"{KERNELS}/common.cuh", f"{KERNELS}/gemv_common.cuh", f"{KERNELS}/async_copy.cuh",
           f"{KERNELS}/stream.cuh",
           "tools/gpu/ring_probe.cu"]


def ptx_of(src: bytes) -> bytes:
    return compile_source(src, "probe.cu", ["--gpu-architecture=compute_90", "--std=c++17"])[0]


class Kernels:
    """The kernels `names` of `sources` (concatenated, as src/compile.rs
    does), compiled by NVRTC and loaded in torch's context (qx_probe.py
    loads its own through this too)."""

    def __init__(self, sources=SOURCES, names=(b"ring_probe", b"load_probe")):
        torch.zeros(1, device="cuda")  # makes torch's context current
        self.cu = load_lib(["libcuda.so.1", "libcuda.so"])
        src = "".join(open(f).read() + "\n" for f in sources).encode()
        mod = ctypes.c_void_p()
        self.check(self.cu.cuModuleLoadData(ctypes.byref(mod), ptx_of(src)), "cuModuleLoadData")
        self.fns = {}
        for name in names:
            f = ctypes.c_void_p()
            self.check(self.cu.cuModuleGetFunction(ctypes.byref(f), mod, name), name)
            # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            self.check(self.cu.cuFuncSetAttribute(f, 8, 200 * 1024), "cuFuncSetAttribute")
            self.fns[name.decode()] = f

    def check(self, rc, what):
        if rc != 0:
            sys.exit(f"{what}: CUDA error {rc}")

    def launch(self, name, grid, block, shared, args):
        """grid: blocks along x, or (x, y); args: ints (passed as 64-bit
        values) or ctypes values (a structure passes by value)."""
        gx, gy = grid if isinstance(grid, tuple) else (grid, 1)
        vals = [a if isinstance(a, (ctypes._SimpleCData, ctypes.Structure)) else ctypes.c_uint64(a)
                for a in args]
        params = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p)
                                                 for v in vals])
        self.check(self.cu.cuLaunchKernel(self.fns[name], gx, gy, 1, block, 1, 1, shared,
                                          self.stream(), params, None), f"launch {name}")

    @staticmethod
    def stream():
        return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

    def graph(self, launch, n):
        """A graph of launch(0), ..., launch(n - 1), captured on the current
        (non-default) stream, instantiated."""
        # CU_STREAM_CAPTURE_MODE_RELAXED: torch's allocator may run meanwhile.
        self.check(self.cu.cuStreamBeginCapture_v2(self.stream(), 2), "cuStreamBeginCapture")
        for i in range(n):
            launch(i)
        g, exe = ctypes.c_void_p(), ctypes.c_void_p()
        self.check(self.cu.cuStreamEndCapture(self.stream(), ctypes.byref(g)), "cuStreamEndCapture")
        self.check(self.cu.cuGraphInstantiateWithFlags(ctypes.byref(exe), g, ctypes.c_uint64(0)),
                   "cuGraphInstantiateWithFlags")
        self.check(self.cu.cuGraphDestroy(g), "cuGraphDestroy")  # the instance keeps its copy
        return exe


# Launches a measured graph holds.
LAUNCHES = 20


def timed(k, launch, reps=5):
    """Microseconds a launch of `launch(i)` (i: the launch's index in the
    graph), best of `reps` replays of a graph of LAUNCHES."""
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        exe = k.graph(launch, LAUNCHES)
        best = float("inf")
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(side)
            k.check(k.cu.cuGraphLaunch(exe, Kernels.stream()), "cuGraphLaunch")
            b.record(side)
            side.synchronize()
            best = min(best, a.elapsed_time(b) * 1e3 / LAUNCHES)
        k.check(k.cu.cuGraphExecDestroy(exe), "cuGraphExecDestroy")
    return best


def main():
    quick = "--quick" in sys.argv
    k = Kernels()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    per_block = 4 << 20  # 4 MB a block: ~550 MB a launch, ~140 µs at 4 TB/s
    size = sms * per_block + (1 << 20)
    buf = torch.empty(size, dtype=torch.uint8, device="cuda")
    buf.random_(0, 255)
    sink = torch.zeros(1, device="cuda")
    threads = 32 * 9  # GS_THREADS

    def report(label, us, total):
        print(f"{label:<58} {us:9.1f} µs {total / us / 1e6:6.2f} TB/s "
              f"{total / us / 1e3 / sms:6.1f} GB/s/SM", flush=True)

    def window(i, used):
        """Launch i's bytes: its own window of the buffer while the buffer
        holds LAUNCHES of them (16-byte aligned), else the buffer's start."""
        span = -(-used // 256) * 256
        return buf.data_ptr() + (i * span if span * LAUNCHES <= size else 0)

    def ring(stage, copies, stages, issue=0, consume=1, pb=per_block, blocks=sms):
        u32 = ctypes.c_uint32

        def go(i):
            args = [window(i, blocks * pb), ctypes.c_uint64(pb), u32(stage), u32(copies),
                    u32(stages), u32(issue), u32(consume), sink.data_ptr()]
            k.launch("ring_probe", blocks, threads, stage * stages, args)

        us = timed(k, go)
        pb_used = pb // stage * stage
        report(f"ring stage {stage >> 10} KB x{stages}, {copies} copies"
               f"{ISSUE[issue]}{'' if consume else ', no reads'}"
               f"{'' if blocks == sms else f', {blocks} blocks'}"
               f"{'' if pb == per_block else f', {pb >> 10} KB a block'}", us, blocks * pb_used)

    def loads(warps, depth, blocks):
        pb = sms * per_block // blocks
        def go(i):
            args = [window(i, blocks * pb), ctypes.c_uint64(pb), ctypes.c_uint32(depth),
                    sink.data_ptr()]
            k.launch("load_probe", blocks, 32 * warps, 0, args)

        us = timed(k, go)
        report(f"registers: {blocks} blocks x {warps} warps, {depth} loads in flight", us,
               blocks * pb)

    torch.cuda.synchronize()
    # The GEMVs' own shapes first: int8 at k = 4,096 (34 KB stages, 3 deep,
    # 2 copies of which one is 16x the other; here 2 equal ones) and int4
    # (18 KB, 5 deep); the bf16 ring (32 KB, 3 deep, 8 copies over lanes).
    ring(32 << 10, 2, 3)
    ring(16 << 10, 2, 5)
    ring(32 << 10, 8, 3, issue=2)
    ring(32 << 10, 2, 3, issue=2)
    ring(32 << 10, 2, 3, issue=1)
    ring(32 << 10, 8, 3)
    ring(32 << 10, 2, 3, consume=0)
    ring(16 << 10, 2, 5, consume=0)
    loads(8, 4, sms)
    loads(8, 4, 2 * sms)
    loads(16, 4, 2 * sms)
    # Short launches: q/k/v's ~100 KB a block.
    ring(16 << 10, 2, 5, pb=112 << 10)
    ring(32 << 10, 8, 3, issue=2, pb=128 << 10)
    if quick:
        return
    for stage in (4 << 10, 8 << 10, 16 << 10, 32 << 10):
        for stages in (2, 3, 4, 6, 8, 12, 16):
            if stage * stages <= 192 << 10:
                ring(stage, 1, stages)
    for copies in (1, 2, 4, 8, 16):
        for issue in (0, 1, 2):
            ring(32 << 10, copies, 4, issue=issue)
    ring(16 << 10, 2, 3, blocks=2 * sms, pb=per_block // 2)
    for depth in (1, 2, 4, 8):
        loads(8, depth, 2 * sms)
        loads(32, depth, sms)


if __name__ == "__main__":
    main()
