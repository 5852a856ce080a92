#!/usr/bin/env python3
"""Each kernel's registers, spills and SASS instruction count, compiled as
the engine compiles it, with no GPU: kernels/common.cuh then each file of
src/compile.rs's SOURCES (the headers its `concat!` names in front),
through NVRTC straight to a cubin for one architecture, as src/compile.rs
does, with ptxas's report (`--ptxas-options=-v`); nvdisasm counts the
instructions. Written after the twentieth session found that code a launch
never executes still costs a decode step (BENCHMARKS.md): keep a kernel
change's size and layout beside its speed.

Needs libnvrtc and nvdisasm: the GPU machine's CUDA, or on any machine the
PyPI wheels, unpacked (`pip download --no-deps nvidia-cuda-nvrtc
nvidia-cuda-nvdisasm -d W`, then `unzip -o` each into W/x), passed as
`--cuda W/x/nvidia/cu13` (its lib/ and bin/ are used).

    python3 tools/gpu/sass_report.py [--cuda DIR] [--arch sm_90]
        [--against KERNELS_DIR] [--layout KERNEL] [--jumps KERNEL] [FILTER ...]

FILTERs keep the kernels whose names contain one of them. `--against`
compiles another checkout's kernels folder (the same file lists) and prints
both counts. `--layout KERNEL` prints that kernel's labelled blocks in
address order: their size and most frequent instructions (a launch jumps
over the blocks of the variants it does not take). `--jumps KERNEL` lists
its forward branches past the PDL wait that skip 64 instructions or more:
where a launch may land on code not yet fetched.
"""
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter

from nvrtc_lib import compile_source

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
CRATE = os.path.join(ROOT, "crates", "turbospark-cuda")
HINT = ": pass --cuda DIR, a CUDA folder with lib/ and bin/ (see the docstring)"


def arg(name, default=None):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def units():
    """(file, [kernel sources in order]) of src/compile.rs's SOURCES."""
    text = open(os.path.join(CRATE, "src", "compile.rs")).read()
    body = text[text.index("pub const SOURCES"):]
    body = body[:body.index("];")]
    out = []
    for m in re.finditer(r'\(\s*"([\w.]+)",\s*(concat!\((.*?)\)|include_str!\("([^"]+)"\))\s*,?\s*\)',
                         body, re.S):
        parts = re.findall(r'include_str!\("\.\./kernels/([^"]+)"\)', m.group(2))
        out.append((m.group(1), parts))
    return out


def ptxas_report(log):
    """kernel -> (registers, spill store bytes) from ptxas's -v lines."""
    out, name, spill = {}, None, 0
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            name, spill = m.group(1), 0
        m = re.search(r"(\d+) bytes spill stores", line)
        if m:
            spill = int(m.group(1))
        m = re.search(r"Used (\d+) registers", line)
        if m and name:
            out[name] = (int(m.group(1)), spill)
            name = None
    return out


def disassemble(cubin, cuda):
    """kernel -> its SASS lines (instructions and labels), nvdisasm -c."""
    tool = os.path.join(cuda, "bin", "nvdisasm") if cuda else "nvdisasm"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        try:
            text = subprocess.run([tool, "-c", f.name], check=True, capture_output=True,
                                  text=True).stdout
        except FileNotFoundError:
            sys.exit(f"{tool} not found{HINT}")
    funcs, cur = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*\.text\.(\w+):", line)
        if m:
            cur = funcs.setdefault(m.group(1), [])
        elif cur is not None and (re.search(r"/\*[0-9a-f]{4,}\*/", line)
                                  or re.match(r"\s*\.L_x_\d+:", line)):
            cur.append(line)
    return funcs


def is_instruction(line):
    return re.search(r"/\*[0-9a-f]{4,}\*/", line) is not None


def opcode(line):
    m = re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]+)", line)
    return m.group(1) if m else "?"


def report(kernels_dir, cuda, arch):
    """kernel -> (registers, spills, instructions, SASS lines)."""
    common = open(os.path.join(kernels_dir, "common.cuh")).read()
    out = {}
    for file, parts in units():
        source = "".join(open(os.path.join(kernels_dir, p)).read() + "\n" for p in parts)
        opts = ["--std=c++17", f"--gpu-architecture={arch}", "--ptxas-options=-v"]
        dirs = [os.path.join(cuda, "lib")] if cuda else []
        cubin, log = compile_source(f"{common}\n#line 1 \"{file}\"\n{source}", file, opts,
                                    cubin=True, dirs=dirs, hint=HINT)
        regs = ptxas_report(log)
        for name, lines in disassemble(cubin, cuda).items():
            r, s = regs.get(name, (0, 0))
            out[name] = (r, s, sum(map(is_instruction, lines)), lines)
    return out


def layout(lines):
    """The labelled blocks of one kernel, in address order."""
    blocks, label, body = [], "entry", []
    for line in lines + [".L_end:"]:
        m = re.match(r"\s*(\.L_\w+):", line)
        if m:
            if body:
                top = Counter(map(opcode, body)).most_common(4)
                blocks.append((label, len(body), top))
            label, body = m.group(1), []
        elif is_instruction(line):
            body.append(line)
    at = 0
    for label, n, top in blocks:
        print(f"  {at:6d} {label:<10} {n:5d}  " + ", ".join(f"{o} {c}" for o, c in top))
        at += n


def jumps(lines, least=64):
    """Forward branches of one kernel that skip at least `least`
    instructions, past its PDL wait (ACQBULK, griddepcontrol.wait):
    (from, to) instruction offsets, the wait's offset first."""
    at, labels, branches, wait = 0, {}, [], None
    for line in lines:
        m = re.match(r"\s*(\.L_\w+):", line)
        if m:
            labels[m.group(1)] = at
        elif is_instruction(line):
            if "ACQBULK" in line and wait is None:
                wait = at
            t = re.search(r"BRA\s+`\((\.L_\w+)\)", line)
            if t:
                branches.append((at, t.group(1)))
            at += 1
    far = [(a, labels[t]) for a, t in branches
           if t in labels and labels[t] - a >= least and (wait is None or a > wait)]
    return wait, far


def main():
    cuda, arch = arg("--cuda"), arg("--arch", "sm_90")
    flags = {"--cuda", "--arch", "--against", "--layout", "--jumps"}
    filters = [a for i, a in enumerate(sys.argv[1:], 1)
               if not a.startswith("--") and sys.argv[i - 1] not in flags]
    here = report(os.path.join(CRATE, "kernels"), cuda, arch)
    other = arg("--against")
    there = report(other, cuda, arch) if other else {}
    print(f"{'kernel':<36} {'regs':>4} {'spill':>5} {'instr':>6}" +
          (f"  {'against':>7} {'regs':>4} {'spill':>5}" if other else ""))
    for name in sorted(here, key=lambda n: -here[n][2]):
        if filters and not any(f in name for f in filters):
            continue
        r, s, n, _ = here[name]
        line = f"{name:<36} {r:4d} {s:5d} {n:6d}"
        if name in there:
            r2, s2, n2, _ = there[name]
            line += f"  {n2:7d} {r2:4d} {s2:5d}"
        print(line)
    name = arg("--layout")
    if name:
        if name not in here:
            sys.exit(f"--layout: no kernel {name}")
        print(f"\n{name}: blocks in address order (instruction offset, label, size, top opcodes)")
        layout(here[name][3])
    name = arg("--jumps")
    if name:
        if name not in here:
            sys.exit(f"--jumps: no kernel {name}")
        wait, far = jumps(here[name][3])
        print(f"\n{name}: PDL wait at instruction {wait}; forward branches past it over "
              f"64 instructions or more (from -> to, skipped):")
        for a, b in far:
            print(f"  {a:6d} -> {b:6d}  {b - a:5d}")


if __name__ == "__main__":
    main()
