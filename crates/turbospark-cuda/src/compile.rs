//! Kernel compilation: the CUDA C++ sources in `kernels/` (built into the
//! binary with `include_str!`) are compiled at run time by NVRTC to a cubin
//! for the present GPU's architecture (`sm_XY`), and the cubin is cached on
//! disk under a hash of everything that determines it, so later starts load
//! it without compiling.
//!
//! It owns the source list, the compiler options and the cache; it must not
//! touch a device (compiling needs only NVRTC, so it also works, and is
//! tested, on machines without a GPU).

use std::ffi::{CStr, c_char, c_int};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use cudarc::nvrtc::{result as nvrtc, sys};

use crate::CudaError;

/// Prepended to every kernel file (NVRTC gets no include path).
const COMMON: &str = include_str!("../kernels/common.cuh");

/// One kernel family per file: (file name, source). The GEMV files share
/// gemv_common.cuh, the streamed ones async_copy.cuh and stream.cuh (moe.cu
/// async_copy.cuh too) and the grouped ones grouped_formats.cuh; the files
/// that touch the KV store share kv_store.cuh, the two attention files that
/// use tensor cores mma.cuh; each put in front. The split attention and its
/// combine are two files of one module.
pub const SOURCES: [(&str, &str); 11] = [
    ("elementwise.cu", include_str!("../kernels/elementwise.cu")),
    ("norm.cu", include_str!("../kernels/norm.cu")),
    (
        "rope_kv.cu",
        concat!(
            include_str!("../kernels/rope.cuh"),
            include_str!("../kernels/kv_store.cuh"),
            include_str!("../kernels/rope_kv.cu")
        ),
    ),
    (
        "gemv_dense.cu",
        concat!(
            include_str!("../kernels/gemv_common.cuh"),
            include_str!("../kernels/async_copy.cuh"),
            include_str!("../kernels/stream.cuh"),
            include_str!("../kernels/gemv_dense.cu")
        ),
    ),
    (
        "gemv_grouped.cu",
        concat!(
            include_str!("../kernels/gemv_common.cuh"),
            include_str!("../kernels/grouped_formats.cuh"),
            include_str!("../kernels/gemv_grouped.cu")
        ),
    ),
    (
        "gemv_grouped_stream.cu",
        concat!(
            include_str!("../kernels/gemv_common.cuh"),
            include_str!("../kernels/async_copy.cuh"),
            include_str!("../kernels/stream.cuh"),
            include_str!("../kernels/grouped_formats.cuh"),
            include_str!("../kernels/gemv_grouped_stream.cu")
        ),
    ),
    ("convert.cu", include_str!("../kernels/convert.cu")),
    (
        "attention.cu",
        concat!(
            include_str!("../kernels/rope.cuh"),
            include_str!("../kernels/kv_store.cuh"),
            include_str!("../kernels/mma.cuh"),
            include_str!("../kernels/attention_mma.cuh"),
            include_str!("../kernels/attention.cu"),
            include_str!("../kernels/attention_combine.cu")
        ),
    ),
    (
        "moe.cu",
        concat!(
            include_str!("../kernels/async_copy.cuh"),
            include_str!("../kernels/moe.cu")
        ),
    ),
    ("sample.cu", include_str!("../kernels/sample.cu")),
    (
        "flash_attention.cu",
        concat!(
            include_str!("../kernels/kv_store.cuh"),
            include_str!("../kernels/mma.cuh"),
            include_str!("../kernels/flash_attention.cu")
        ),
    ),
];

/// Precise math everywhere (no fast-math): kernels must agree with the CPU
/// reference to f32 rounding.
const OPTIONS: [&str; 1] = ["--std=c++17"];

/// Whether NVRTC can be loaded (it needs no GPU).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to open the shared library.
    unsafe { sys::is_culib_present() }
}

/// NVRTC's (major, minor) version.
fn nvrtc_version() -> Result<(c_int, c_int), CudaError> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two valid out-pointers.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| CudaError::Nvrtc(e.to_string()))?;
    Ok((major, minor))
}

/// The cubin for kernel file `file` on architecture `arch` (e.g. "sm_90"),
/// from the disk cache ([`cache_dir`]) or freshly compiled (and then cached;
/// a cache that cannot be written is not an error).
pub fn cubin(file: &str, source: &str, arch: &str) -> Result<Vec<u8>, CudaError> {
    cubin_cached_in(file, source, arch, cache_dir(), true)
}

/// Compiles afresh and replaces the cache entry (for an entry the driver
/// refused to load).
pub fn recompile(file: &str, source: &str, arch: &str) -> Result<Vec<u8>, CudaError> {
    cubin_cached_in(file, source, arch, cache_dir(), false)
}

/// [`cubin`] with an explicit cache directory (`None`: no cache); `read`
/// false skips reading the cache but still writes it.
pub fn cubin_cached_in(
    file: &str,
    source: &str,
    arch: &str,
    cache: Option<PathBuf>,
    read: bool,
) -> Result<Vec<u8>, CudaError> {
    let (major, minor) = nvrtc_version()?;
    let key = fnv1a(&[
        b"turbospark-cuda 1",
        format!("nvrtc {major}.{minor} {arch}").as_bytes(),
        OPTIONS.join(" ").as_bytes(),
        crate::trace::prelude().as_bytes(),
        COMMON.as_bytes(),
        source.as_bytes(),
    ]);
    let stem = file.trim_end_matches(".cu");
    let path = cache.map(|d| d.join(format!("{stem}-{arch}-{key:016x}.cubin")));
    if let Some(bytes) = path
        .as_ref()
        .filter(|_| read)
        .and_then(|p| std::fs::read(p).ok())
    {
        return Ok(bytes);
    }
    let bytes = compile(file, source, arch)?;
    if let Some(p) = path {
        store(&p, &bytes);
    }
    Ok(bytes)
}

/// `$TURBOSPARK_CACHE/cubin`, else `$XDG_CACHE_HOME/turbospark/cubin`, else
/// `~/.cache/turbospark/cubin`.
pub fn cache_dir() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let root = var("TURBOSPARK_CACHE")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("turbospark")))
        .or_else(|| var("HOME").map(|d| d.join(".cache/turbospark")))?;
    Some(root.join("cubin"))
}

/// Writes through a temporary file (unique to this process and call) and a
/// rename, so a concurrent reader never sees half a cubin.
fn store(path: &std::path::Path, bytes: &[u8]) {
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    let Some(dir) = path.parent() else { return };
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".tmp-{}-{seq}", std::process::id()));
    let ok = std::fs::create_dir_all(dir).is_ok() && std::fs::write(&tmp, bytes).is_ok();
    if !ok || std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

fn compile(file: &str, source: &str, arch: &str) -> Result<Vec<u8>, CudaError> {
    let prelude = crate::trace::prelude();
    let full = format!("{prelude}{COMMON}\n#line 1 \"{file}\"\n{source}");
    let fail = |what: String| CudaError::Compile {
        file: file.to_string(),
        log: what,
    };
    let src = std::ffi::CString::new(full).map_err(|e| fail(e.to_string()))?;
    let name = std::ffi::CString::new(file).map_err(|e| fail(e.to_string()))?;
    let prog = nvrtc::create_program(&src, Some(&name)).map_err(|e| fail(e.to_string()))?;
    let mut options: Vec<String> = OPTIONS.iter().map(|s| s.to_string()).collect();
    options.push(format!("--gpu-architecture={arch}"));
    // SAFETY: `prog` is a live program until destroyed below; every buffer
    // handed to NVRTC has the size NVRTC reported.
    let result = (|| unsafe {
        if let Err(e) = nvrtc::compile_program(prog, &options) {
            let log = nvrtc::get_program_log(prog)
                .map(|l| CStr::from_ptr(l.as_ptr()).to_string_lossy().into_owned())
                .unwrap_or_default();
            return Err(fail(format!("{e}\n{log}")));
        }
        let mut size = 0usize;
        sys::nvrtcGetCUBINSize(prog, &mut size)
            .result()
            .map_err(|e| fail(e.to_string()))?;
        let mut buf = vec![0u8; size];
        sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut c_char)
            .result()
            .map_err(|e| fail(e.to_string()))?;
        Ok(buf)
    })();
    // SAFETY: created above, destroyed once.
    let _ = unsafe { nvrtc::destroy_program(prog) };
    result
}

/// 64-bit FNV-1a over the parts (each followed by a separator byte): stable
/// across Rust versions, unlike std's hasher.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in part.iter().chain(&[0xffu8]) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}
