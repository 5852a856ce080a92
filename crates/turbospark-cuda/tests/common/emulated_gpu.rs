//! The emulated GPU, for a test process that finds no CUDA driver: the
//! driver, NVRTC and cuBLAS of `tests/emulate/driver/`, built with the
//! system's C++ compiler and loaded in place of the real libraries, so the
//! GPU tests run the backend's host code against its kernels' source on
//! the CPU (CI has no GPU). It owns building and loading those libraries;
//! it must not be used where a real driver is there (`gpu` asks only when
//! the driver library is missing).
//!
//! cudarc opens `libcuda.so`, `libnvrtc.so` and `libcublas.so` by name;
//! the dynamic loader answers a name with an already-loaded library whose
//! soname it is, so loading these by path first is all it takes.
//!
//! `TURBOSPARK_EMULATED_GPU=0` leaves the emulation out (the tests then
//! skip, as without a GPU); without a C++ compiler it is left out too,
//! unless `TURBOSPARK_REQUIRE_EMULATION` is set (CI), when that fails.

use super::cxx;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The three libraries: (soname, source in tests/emulate/driver).
const LIBRARIES: [(&str, &str); 3] = [
    ("libcuda.so", "cuda.cpp"),
    ("libnvrtc.so", "nvrtc.cpp"),
    ("libcublas.so", "cublas.cpp"),
];

/// Whether the emulated GPU was loaded in this process ([`load`]).
static LOADED: OnceLock<bool> = OnceLock::new();

/// Whether this process runs on the emulated GPU (without loading it).
pub fn in_use() -> bool {
    LOADED.get() == Some(&true)
}

/// Whether the emulated GPU is loaded in this process (built and loaded
/// on the first call).
pub fn load() -> bool {
    *LOADED.get_or_init(|| {
        if std::env::var("TURBOSPARK_EMULATED_GPU").as_deref() == Ok("0") {
            return false;
        }
        let Some(dir) = build() else { return false };
        for (soname, _) in LIBRARIES {
            let path = dir.join(soname);
            // SAFETY: our own libraries, whose constructors do nothing; kept
            // loaded for the life of the process.
            let lib = unsafe {
                libloading::os::unix::Library::open(
                    Some(&path),
                    libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL,
                )
            }
            .unwrap_or_else(|e| panic!("loading the emulated {soname}: {e}"));
            std::mem::forget(lib);
        }
        true
    })
}

/// Builds the libraries into a folder of the target directory named by a
/// hash of what makes them (test processes run side by side: a lock file
/// makes one build), or `None` where there is no C++ compiler.
fn build() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let driver = root.join("tests/emulate/driver");
    let compiler = cxx::compiler();
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("emulated-gpu");
    let defines = [
        format!("-DTS_CXX=\"{compiler}\""),
        format!(
            "-DTS_EMULATE_DIR=\"{}\"",
            root.join("tests/emulate").display()
        ),
        format!("-DTS_KERNELS_DIR=\"{}\"", root.join("kernels").display()),
        format!("-DTS_BUILD_DIR=\"{}\"", base.join("modules").display()),
    ];
    let mut key = 0xcbf2_9ce4_8422_2325u64;
    let sources = LIBRARIES.iter().map(|(_, s)| driver.join(s));
    for part in sources
        .map(|p| std::fs::read(p).expect("the emulated driver's source"))
        .chain(defines.iter().map(|d| d.clone().into_bytes()))
    {
        for b in part.into_iter().chain([0xff]) {
            key = (key ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    let dir = base.join(format!("{key:016x}"));
    std::fs::create_dir_all(&dir).expect("the emulated GPU's folder");
    let lock = std::fs::File::create(base.join("lock")).expect("the emulated GPU's lock");
    lock.lock().expect("the emulated GPU's lock");
    for (soname, source) in LIBRARIES {
        let out = dir.join(soname);
        if out.exists() {
            continue;
        }
        let tmp = dir.join(format!("{soname}.tmp"));
        let mut command = Command::new(&compiler);
        command.args(["-std=c++20", "-O1", "-Wall", "-Werror", "-fPIC", "-shared"]);
        command
            .arg(format!("-Wl,-soname,{soname}"))
            .arg("-Wl,-rpath,$ORIGIN");
        command
            .args(&defines)
            .arg(driver.join(source))
            .arg("-o")
            .arg(&tmp);
        if soname == "libcublas.so" {
            // cuBLAS's products go through the driver's stream.
            command.arg("-L").arg(&dir).arg("-lcuda");
        }
        let run = cxx::run(&mut command, "the emulated GPU")?;
        assert!(
            run.status.success(),
            "{compiler} could not build the emulated {soname}:\n{}",
            String::from_utf8_lossy(&run.stderr)
        );
        std::fs::rename(&tmp, &out).expect("the emulated GPU's library");
    }
    Some(dir)
}
