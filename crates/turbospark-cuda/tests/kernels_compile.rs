//! Every kernel file compiles with NVRTC for Hopper (sm_90) and for the
//! oldest GPUs the backend takes (Ampere, sm_80: kernels that use sm_90's
//! instructions must guard them), and is cached. Compiling needs NVRTC
//! only, not a GPU, so this runs on any machine where libnvrtc can be
//! loaded and skips elsewhere.

use turbospark_cuda::compile::{SOURCES, cubin_cached_in, nvrtc_present};

#[test]
fn every_kernel_file_compiles_for_sm80_and_sm90_and_is_cached() {
    if !nvrtc_present() {
        println!("skipped: NVRTC not found");
        return;
    }
    let dir = std::env::temp_dir().join(format!("turbospark-cuda-test-{}", std::process::id()));
    for arch in ["sm_90", "sm_80"] {
        for (file, source) in SOURCES {
            let bin = cubin_cached_in(file, source, arch, Some(dir.clone()), true)
                .unwrap_or_else(|e| panic!("{arch}: {e}"));
            assert!(bin.starts_with(b"\x7fELF"), "{file} ({arch}): not a cubin");
            // The second time comes from the cache, byte for byte.
            let again = cubin_cached_in(file, source, arch, Some(dir.clone()), true).unwrap();
            assert_eq!(bin, again, "{file} ({arch}): cached cubin differs");
        }
    }
    let cached = std::fs::read_dir(&dir).unwrap().count();
    assert_eq!(
        cached,
        2 * SOURCES.len(),
        "one cubin per kernel file and arch"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
