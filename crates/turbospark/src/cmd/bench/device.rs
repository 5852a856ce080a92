//! What bench asks of a device beyond [`turbospark_backend::Backend`]: the
//! copy bandwidth of the memory the weights are read from, the device
//! memory in use, and what a recorded decode step holds. A CLI-side trait,
//! implemented for each backend the CLI names, so the backend trait stays
//! about operations.

use std::time::Instant;

use anyhow::Result;
use rayon::prelude::*;
use serde::Serialize;
use turbospark_backend::Backend;

pub trait DeviceStats: Backend {
    /// Copy bandwidth of the memory decode reads weights from, in bytes per
    /// second with read and write bytes both counted; measured when called.
    fn copy_bandwidth(&self) -> Result<f64>;

    /// Device memory in use now, in bytes; `None` where the weights live in
    /// host memory (the resident set size says it there).
    fn device_memory_used(&self) -> Result<Option<u64>>;

    /// The device for humans, e.g. "16 threads" (CPU) or "NVIDIA H200, sm_90".
    fn describe(&self) -> String;

    /// What the recorded decode step `g` holds; `None` where the backend
    /// records nothing (the CPU) or reading the graph failed.
    fn graph_census(&self, g: &Self::Graph) -> Option<GraphCensus>;
}

/// A recorded decode step's nodes and edges (`--json`'s
/// `decode_graph_nodes`). An edge is programmatic where the kernel after it
/// may start while the one before runs (PDL); a step whose count drops
/// loses that overlap.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct GraphCensus {
    pub kernels: usize,
    pub other_nodes: usize,
    pub edges: usize,
    pub programmatic_edges: usize,
}

impl DeviceStats for turbospark_cpu::Cpu {
    fn copy_bandwidth(&self) -> Result<f64> {
        let bandwidth = host_copy_bandwidth(HOST_COPY_BYTES);
        // The measurement's buffers are gone; the peak resident set size
        // reported at the end should be the model's, not theirs.
        reset_peak_rss();
        Ok(bandwidth)
    }

    fn device_memory_used(&self) -> Result<Option<u64>> {
        Ok(None)
    }

    fn describe(&self) -> String {
        format!("{} threads", rayon::current_num_threads())
    }

    fn graph_census(&self, _: &()) -> Option<GraphCensus> {
        None
    }
}

#[cfg(feature = "cuda")]
impl DeviceStats for turbospark_cuda::Cuda {
    fn copy_bandwidth(&self) -> Result<f64> {
        Ok(self.measure_copy_bandwidth()?)
    }

    fn device_memory_used(&self) -> Result<Option<u64>> {
        Ok(Some(self.memory_used()?))
    }

    fn describe(&self) -> String {
        format!("{}, {}", self.device_name(), self.arch())
    }

    fn graph_census(&self, g: &turbospark_cuda::Recording) -> Option<GraphCensus> {
        let n = g.nodes().ok()?;
        Some(GraphCensus {
            kernels: n.kernels,
            other_nodes: n.memsets + n.memcpys + n.allocs + n.frees + n.other,
            edges: n.edges,
            programmatic_edges: n.programmatic_edges,
        })
    }
}

/// Bytes per buffer of the host copy: well past any last-level cache.
const HOST_COPY_BYTES: usize = 512 << 20;

/// Host memcpy bandwidth with the threads of rayon's pool (the ones decode
/// uses), read and write bytes both counted: the best of five parallel
/// copies of `n` bytes after one that faults the pages in.
pub fn host_copy_bandwidth(n: usize) -> f64 {
    let src = vec![1u8; n];
    let mut dst = vec![0u8; n];
    // A few pieces per thread, whole pages each.
    let piece = n
        .div_ceil(4 * rayon::current_num_threads())
        .next_multiple_of(4096);
    let mut best = f64::INFINITY;
    for run in 0..6 {
        let t = Instant::now();
        dst.par_chunks_mut(piece)
            .zip(src.par_chunks(piece))
            .for_each(|(d, s)| d.copy_from_slice(s));
        std::hint::black_box(&mut dst);
        if run > 0 {
            best = best.min(t.elapsed().as_secs_f64());
        }
    }
    2.0 * n as f64 / best.max(1e-9)
}

/// Resets the kernel's peak resident set size (VmHWM) to the current one
/// (Linux; elsewhere nothing happens).
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// A kB field of /proc/self/status (VmRSS, VmHWM) in bytes; 0 where /proc
/// is unavailable.
pub fn proc_status_bytes(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_copy_bandwidth_is_plausible() {
        // 16 MiB: fast, and any machine copies it between 100 MB/s and 10 TB/s.
        let bw = host_copy_bandwidth(16 << 20);
        assert!((1e8..1e13).contains(&bw), "{bw} B/s");
    }
}
