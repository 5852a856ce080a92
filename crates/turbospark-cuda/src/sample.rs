//! Token choice on the device (kernels/sample.cu): greedy decoding reads
//! back one id per row instead of the logits. It owns the launch; the
//! definition of the result is the host `turbospark_backend::argmax`.

use crate::kernels::Arg;
use crate::{Cuda, CudaTensor};

/// Threads of the one block per row (`ARGMAX_THREADS` in the kernel).
const THREADS: u32 = 1024;

pub fn argmax(be: &Cuda, t: &CudaTensor) -> Vec<u32> {
    if t.rows == 0 {
        return Vec::new();
    }
    if t.cols == 0 {
        return vec![0; t.rows];
    }
    let out = be.scratch::<u32>(t.rows);
    be.launch(
        &be.k.argmax_rows,
        (t.rows as u32, 1, 1),
        THREADS,
        &[
            Arg::Ptr(be.ptr(&out)),
            Arg::Ptr(be.ptr(&t.data)),
            Arg::U32(t.cols as u32),
        ],
    );
    be.stream
        .clone_dtoh(&out.slice(..t.rows))
        .unwrap_or_else(|e| panic!("CUDA: reading back argmax: {e}"))
}
