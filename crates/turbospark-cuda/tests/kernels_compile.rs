//! Every kernel file compiles with NVRTC for Hopper (sm_90) and for the
//! oldest GPUs the backend takes (Ampere, sm_80: kernels that use sm_90's
//! instructions must guard them), is cached, and holds every kernel the
//! backend loads from it (a missing name would fail only when a GPU loads
//! the module). Compiling needs NVRTC only, not a GPU, so this runs on any
//! machine where libnvrtc can be loaded and skips elsewhere.

use turbospark_cuda::compile::{SOURCES, cubin_cached_in, nvrtc_present};
use turbospark_cuda::kernels::NAMES;

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
            // An entry point's name stands whole in the cubin's string
            // table: after a NUL or ".text.", before a NUL (so "glu" is
            // not found in "gemv_q4_qx_glu", nor "f" in "f_norm").
            let (_, names) = NAMES
                .iter()
                .find(|(f, _)| *f == file)
                .expect("a file NAMES lists");
            for name in *names {
                let whole = |before: &[u8]| [before, name.as_bytes(), b"\0"].concat();
                let (sym, text) = (whole(b"\0"), whole(b".text."));
                let found = [sym, text]
                    .iter()
                    .any(|s| bin.windows(s.len()).any(|w| w == s.as_slice()));
                assert!(found, "{file} ({arch}): no kernel {name}");
            }
            // The second time comes from the cache, byte for byte.
            let again = cubin_cached_in(file, source, arch, Some(dir.clone()), true).unwrap();
            assert_eq!(bin, again, "{file} ({arch}): cached cubin differs");
        }
    }
    for (file, _) in NAMES {
        assert!(
            SOURCES.iter().any(|(f, _)| f == file),
            "{file}: not compiled"
        );
    }
    let cached = std::fs::read_dir(&dir).unwrap().count();
    assert_eq!(
        cached,
        2 * SOURCES.len(),
        "one cubin per kernel file and arch"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
