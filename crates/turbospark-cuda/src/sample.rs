//! Token choice on the device (kernels/sample.cu): greedy decoding reads
//! back one id per row instead of the logits. It owns the launch and the
//! decoding of the kernel's keys; the definition of the result is the host
//! `turbospark_backend::argmax`.

use crate::kernels::Arg;
use crate::{Cuda, CudaTensor};

/// Threads per block, and the most blocks one row is split over.
const THREADS: u32 = 256;
const MAX_BLOCKS_PER_ROW: usize = 64;

pub fn argmax(be: &Cuda, t: &CudaTensor) -> Vec<u32> {
    if t.rows == 0 {
        return Vec::new();
    }
    if t.cols == 0 {
        return vec![0; t.rows];
    }
    // Zero = "no number seen" for every row.
    let best = be.zeros::<u64>(t.rows);
    let blocks = t
        .cols
        .div_ceil(THREADS as usize * 8)
        .clamp(1, MAX_BLOCKS_PER_ROW);
    be.launch(
        &be.k.argmax_rows,
        (t.rows as u32, blocks as u32, 1),
        THREADS,
        &[
            Arg::Ptr(be.ptr(&best)),
            Arg::Ptr(be.ptr(&t.data)),
            Arg::U32(t.cols as u32),
        ],
    );
    let keys = be
        .stream
        .clone_dtoh(&best.slice(..t.rows))
        .unwrap_or_else(|e| panic!("CUDA: reading back argmax: {e}"));
    keys.into_iter()
        .map(|k| if k == 0 { 0 } else { u32::MAX - k as u32 })
        .collect()
}
