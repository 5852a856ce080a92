//! The timeline build (`TURBOSPARK_CUDA_TRACE`, src/trace.rs) compiles:
//! with the variable set, every kernel file is compiled with `TS_TRACE`
//! (kernels/common.cuh's notes in `pdl_enter`) and its cubin holds the
//! `ts_trace` pointer the backend sets in each module; without it, none
//! does. Needs NVRTC only (no GPU); skips where libnvrtc cannot be loaded.
//! A test binary of its own: the variable is set for this process.

use turbospark_cuda::compile::{SOURCES, cubin_cached_in, nvrtc_present};

fn has_symbol(bin: &[u8], name: &str) -> bool {
    let s = [b"\0", name.as_bytes(), b"\0"].concat();
    bin.windows(s.len()).any(|w| w == s.as_slice())
}

#[test]
fn every_kernel_file_compiles_with_the_timeline_notes() {
    if !nvrtc_present() {
        println!("skipped: NVRTC not found");
        return;
    }
    let dir = std::env::temp_dir().join(format!("turbospark-trace-test-{}", std::process::id()));
    let (file, source) = SOURCES[0];
    let plain = cubin_cached_in(file, source, "sm_90", None, false).unwrap();
    assert!(
        !has_symbol(&plain, "ts_trace"),
        "{file}: notes without the variable"
    );
    // SAFETY: this test binary's only test, so no other thread reads the
    // environment while it is written.
    unsafe { std::env::set_var("TURBOSPARK_CUDA_TRACE", dir.join("timeline.txt")) };
    for (file, source) in SOURCES {
        let bin = cubin_cached_in(file, source, "sm_90", Some(dir.clone()), true)
            .unwrap_or_else(|e| panic!("{file} with TS_TRACE: {e}"));
        assert!(
            has_symbol(&bin, "ts_trace"),
            "{file}: no ts_trace in the timeline build"
        );
    }
    // The notes are part of the cache key: a plain cubin is never taken
    // for a timeline one.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), SOURCES.len());
    std::fs::remove_dir_all(&dir).unwrap();
}
