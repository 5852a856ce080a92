"""NVRTC and the driver through ctypes, for the scripts of this folder
(no torch here): a shared library by name, and one source compiled to PTX
or to a cubin with NVRTC's log (ptxas's report with `-v` options)."""
import ctypes
import ctypes.util
import os
import sys


def load_lib(names, dirs=(), hint=""):
    """The first of `names` that loads, from `dirs` first, then the
    loader's path; exits naming them (and `hint`) when none does."""
    for d in list(dirs) + [""]:
        for n in names:
            try:
                return ctypes.CDLL(os.path.join(d, n) if d else n)
            except OSError:
                pass
    found = ctypes.util.find_library(names[0].split(".so")[0].removeprefix("lib"))
    if found:
        return ctypes.CDLL(found)
    sys.exit(f"cannot load any of {names}{hint}")


def compile_source(src, name, opts, cubin=False, dirs=(), hint=""):
    """(PTX or cubin bytes, NVRTC's log) of `src` (str or bytes) compiled
    with `opts` (strings); exits with the log when it does not compile."""
    lib = load_lib(["libnvrtc.so.13", "libnvrtc.so", "libnvrtc.so.12"], dirs, hint)
    src = src.encode() if isinstance(src, str) else src
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src, name.encode(), 0, None, None):
        sys.exit(f"{name}: nvrtcCreateProgram failed")
    raw = [o.encode() for o in opts]
    rc = lib.nvrtcCompileProgram(prog, len(raw), (ctypes.c_char_p * len(raw))(*raw))
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    if rc:
        sys.exit(f"NVRTC, {name}: {log.value.decode()[:3000]}")
    size, get = (lib.nvrtcGetCUBINSize, lib.nvrtcGetCUBIN) if cubin else (lib.nvrtcGetPTXSize,
                                                                         lib.nvrtcGetPTX)
    size(prog, ctypes.byref(n))
    out = ctypes.create_string_buffer(n.value)
    get(prog, out)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return (out.raw if cubin else out.value), log.value.decode()
