//! A decode step's timeline as the GPU ran it: a measuring tool, off unless
//! `TURBOSPARK_CUDA_TRACE=FILE` names where to write it.
//!
//! Kernel times from Nsight Compute are each kernel alone (it serialises
//! them), so they miss what programmatic dependent launch hides or adds in
//! a recorded step. With the variable set, the kernels are compiled with
//! `TS_TRACE` (kernels/common.cuh): every block's first thread notes in one
//! device buffer when it reached its PDL wait and when the wait returned
//! (`%globaltimer`), with its launch's `%gridid`, and when it passed each
//! point a kernel marks with `TS_PHASE(k)`. The host notes each
//! launch's kernel name and geometry in issue order. When the backend is
//! dropped both go to FILE, which `tools/gpu/timeline.py` turns into what
//! each launch of a replayed step costs in place.
//!
//! It owns the buffer, the launch notes and the file; it must not change
//! what any kernel computes (one thread a block writes only this buffer).

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DriverError};

/// Entries the buffer holds (4 words each: 64 MiB), a ring: past it the
/// newest overwrite the oldest.
const CAPACITY: usize = 1 << 21;

/// A phase's entry (`TS_PHASE`) holds its number (below 2^16) and how
/// long the note took (ns, below 2^16) above it where a wait's holds a
/// reading: below this, which a `%globaltimer` reading never is.
const PHASES: u64 = 1 << 32;

/// The file `TURBOSPARK_CUDA_TRACE` names, if any.
fn path() -> Option<PathBuf> {
    std::env::var_os("TURBOSPARK_CUDA_TRACE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// What goes in front of every kernel source: the define that turns the
/// notes on, or nothing (part of the cubin cache's key).
pub(crate) fn prelude() -> &'static str {
    if path().is_some() {
        "#define TS_TRACE 1\n"
    } else {
        ""
    }
}

pub(crate) struct Trace {
    path: PathBuf,
    /// `ts_trace` of kernels/common.cuh: [taken, capacity, entries...].
    buf: CudaSlice<u64>,
    /// One line a launch, in issue order: name, grid, block, shared bytes,
    /// and whether a graph was being recorded.
    launches: Mutex<Vec<String>>,
}

impl Trace {
    /// The timeline buffer on `stream`, where `TURBOSPARK_CUDA_TRACE` asks
    /// for one.
    pub(crate) fn new(stream: &Arc<CudaStream>) -> Result<Option<Trace>, DriverError> {
        let Some(path) = path() else {
            return Ok(None);
        };
        let mut buf = stream.alloc_zeros::<u64>(2 + 4 * CAPACITY)?;
        stream.memcpy_htod(&[0u64, CAPACITY as u64], &mut buf.slice_mut(..2))?;
        stream.synchronize()?;
        Ok(Some(Trace {
            path,
            buf,
            launches: Mutex::new(Vec::new()),
        }))
    }

    /// The buffer's device address (what each module's `ts_trace` holds).
    pub(crate) fn device_address(&self, stream: &Arc<CudaStream>) -> u64 {
        let (ptr, _sync) = self.buf.device_ptr(stream);
        ptr
    }

    /// Notes one launch.
    pub(crate) fn note(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        (block, shared): (u32, u32),
        recording: bool,
    ) {
        let line = format!(
            "L {name} {} {} {} {block} {shared} {}",
            grid.0, grid.1, grid.2, recording as u8
        );
        self.launches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(line);
    }

    /// Writes the launches and the entries noted so far to the file, as
    /// text: `L name gx gy gz block shared recording` lines, then `E gridid
    /// reached returned smid block_threads block` lines (a block's wait) and
    /// `P gridid time phase smid block_threads block held` lines (a block
    /// passing `TS_PHASE(phase)`; `held`: ns the note held the thread),
    /// oldest first. A failure is reported on stderr:
    /// a measuring tool must not stop the run it measures.
    pub(crate) fn write(&self, stream: &Arc<CudaStream>) {
        if let Err(e) = self.try_write(stream) {
            eprintln!(
                "turbospark: writing the timeline to {}: {e}",
                self.path.display()
            );
        }
    }

    fn try_write(&self, stream: &Arc<CudaStream>) -> Result<(), Box<dyn std::error::Error>> {
        stream.synchronize()?;
        let head = stream.clone_dtoh(&self.buf.slice(..2))?;
        let taken = head[0] as usize;
        let n = taken.min(CAPACITY);
        let mut entries = stream.clone_dtoh(&self.buf.slice(2..2 + 4 * n))?;
        // Oldest first: past a full ring, the oldest is where the next goes.
        if taken > CAPACITY {
            entries.rotate_left(4 * (taken % CAPACITY));
        }
        let mut out = std::io::BufWriter::new(std::fs::File::create(&self.path)?);
        writeln!(out, "# taken {taken} kept {n}")?;
        for l in self
            .launches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            writeln!(out, "{l}")?;
        }
        for e in entries.chunks_exact(4) {
            let (sm, threads, block) = (e[3] >> 48, (e[3] >> 32) & 0xffff, e[3] & 0xffff_ffff);
            if e[2] < PHASES {
                let (phase, held) = (e[2] & 0xffff, e[2] >> 16);
                writeln!(
                    out,
                    "P {} {} {phase} {sm} {threads} {block} {held}",
                    e[0], e[1]
                )?;
            } else {
                writeln!(out, "E {} {} {} {sm} {threads} {block}", e[0], e[1], e[2])?;
            }
        }
        out.flush()?;
        Ok(())
    }
}
