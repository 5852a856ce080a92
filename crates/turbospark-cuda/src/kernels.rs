//! The loaded kernel functions and the one way to launch them.
//!
//! It owns the mapping from kernel names to the compiled modules and the
//! kernel-argument ABI (`Arg`, `RopeFreqs`); it must not decide what to
//! launch (that is the operation modules' job).

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use crate::CudaError;
use crate::compile::{SOURCES, cubin, recompile};

/// Threads per block of the element-wise kernels.
pub const BLOCK: u32 = 256;

/// The RoPE kernel's by-value table (`struct RopeFreqs` in kernels/rope_kv.cu):
/// inv_freq for up to 256 pairs, i.e. head_dim ≤ 512.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RopeFreqs(pub [f32; 256]);

// SAFETY: plain f32 data, the layout of the C struct.
unsafe impl DeviceRepr for RopeFreqs {}

/// One kernel argument, in the C type of the kernel's parameter: `Ptr` for
/// any pointer (a device address, 0 for null), `U32` for `u32`, `I32` for
/// `int`, `U64` for `u64`, `I64` for `i64`, `F32` for `float`.
pub enum Arg {
    Ptr(u64),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    Freqs(Box<RopeFreqs>),
    /// The GEMV kernels' segment table, by value.
    Segs(Box<crate::linear::GemvSegs>),
}

macro_rules! kernels {
    ($($file:literal => [$($name:ident),* $(,)?]),* $(,)?) => {
        /// Every kernel, named as in its `.cu` file.
        pub struct Kernels {
            $($(pub $name: CudaFunction,)*)*
        }

        impl Kernels {
            /// Compiles (or takes from the cache) every kernel file for
            /// `arch` and loads its functions into `ctx`.
            pub fn load(ctx: &Arc<CudaContext>, arch: &str) -> Result<Self, CudaError> {
                let mut modules = HashMap::new();
                for (file, source) in SOURCES {
                    let load = |bin: Vec<u8>| ctx.load_module(Ptx::from_binary(bin));
                    let module = match load(cubin(file, source, arch)?) {
                        Ok(m) => m,
                        // A damaged cache entry: compile again and replace it.
                        Err(_) => load(recompile(file, source, arch)?)?,
                    };
                    modules.insert(file, module);
                }
                Ok(Kernels {
                    $($($name: modules[$file].load_function(stringify!($name))?,)*)*
                })
            }
        }
    };
}

kernels! {
    "elementwise.cu" => [embed, add_inplace, scale_inplace, softcap_inplace, glu, add_bias],
    "norm.cu" => [rms_norm, add_rms_norm],
    "rope_kv.cu" => [rope_kv_write],
    "gemv.cu" => [
        gemv_f32, gemv_bf16, gemv_f16, gemv_mxfp4, gemv_q8, gemv_q4,
        gemv_f32_x1, gemv_bf16_x1, gemv_f16_x1, gemv_mxfp4_x1, gemv_q8_x1, gemv_q4_x1,
        gemv_mxfp4_qx, gemv_q8_qx, gemv_q4_qx,
    ],
    "convert.cu" => [split_bf16, to_bf16, widen_f32, mxfp4_to_bf16, dequant_bf16],
    "attention.cu" => [
        attn_partial, attn_gqa_hd64_g8, attn_gqa_hd64_g16, attn_gqa_hd128_g4, attn_gqa_hd128_g8,
        attn_gqa_hd256_g4, attn_combine,
    ],
    "sample.cu" => [argmax_rows],
    "moe.cu" => [moe_route, moe_act, moe_combine, moe_gather, moe_act_rows, moe_combine_rows],
    "flash_attention.cu" => [flash_attn_hd64, flash_attn_hd128, flash_attn_hd256],
}

/// Launches `f` on `stream` with `grid` blocks of `block` threads.
pub fn launch(
    stream: &CudaStream,
    f: &CudaFunction,
    grid: (u32, u32, u32),
    block: u32,
    args: &[Arg],
) {
    launch_shared(stream, f, grid, block, 0, args)
}

/// [`launch`] with `shared` bytes of dynamic shared memory a block.
///
/// Panics when the launch fails: the backend trait has no error path for
/// operations, and a failed launch means a broken device or a bug.
pub fn launch_shared(
    stream: &CudaStream,
    f: &CudaFunction,
    grid: (u32, u32, u32),
    block: u32,
    shared: u32,
    args: &[Arg],
) {
    let mut b = stream.launch_builder(f);
    for a in args {
        match a {
            Arg::Ptr(v) | Arg::U64(v) => b.arg(v),
            Arg::U32(v) => b.arg(v),
            Arg::I32(v) => b.arg(v),
            Arg::I64(v) => b.arg(v),
            Arg::F32(v) => b.arg(v),
            Arg::Freqs(v) => b.arg(v.as_ref()),
            Arg::Segs(v) => b.arg(v.as_ref()),
        };
    }
    let cfg = LaunchConfig {
        grid_dim: grid,
        block_dim: (block, 1, 1),
        shared_mem_bytes: shared,
    };
    // SAFETY: every call site passes the arguments of the kernel's C
    // signature, in order and with the C types (see `Arg`); pointers are
    // device addresses of live allocations sized by the caller.
    unsafe { b.launch(cfg) }.unwrap_or_else(|e| panic!("CUDA kernel launch failed: {e}"));
}

/// Blocks for a grid-stride kernel over `n` elements.
pub fn grid_for(n: u64) -> (u32, u32, u32) {
    (n.div_ceil(BLOCK as u64).clamp(1, 1 << 20) as u32, 1, 1)
}
