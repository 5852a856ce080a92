//! The MXFP4 checkpoint layout every backend accepts: `blocks` u8
//! `[.., rows, cols/32, 16]` and `scales` u8 `[.., rows, cols/32]`. Only the
//! validation lives here (so every backend rejects the same inputs with the
//! same message); decoding belongs to each backend.

use turbospark_format::{DType, HostTensor};

use crate::{BackendError, Result};

/// Checks a blocks/scales pair and returns the logical weight shape
/// `[.., rows, cols]`.
pub fn mxfp4_shape(blocks: &HostTensor<'_>, scales: &HostTensor<'_>) -> Result<Vec<usize>> {
    let bad = |what: String| {
        Err(BackendError::Unsupported(format!(
            "tensor `{}`: {what}",
            blocks.name
        )))
    };
    let (bs, ss) = (blocks.shape, scales.shape);
    if blocks.dtype != DType::U8 || scales.dtype != DType::U8 {
        return bad("MXFP4 blocks and scales must be u8".into());
    }
    if bs.len() < 2 || bs[bs.len() - 1] != 16 || bs[..bs.len() - 1] != *ss {
        return bad(format!(
            "blocks {bs:?} and scales {ss:?} are not [.., rows, groups, 16] and [.., rows, groups]"
        ));
    }
    if blocks.bytes.len() != blocks.numel() || scales.bytes.len() != scales.numel() {
        return bad("byte counts do not match the shapes".into());
    }
    let mut shape = ss.to_vec();
    let groups = shape.pop().unwrap_or(0);
    shape.push(groups * 32);
    Ok(shape)
}
