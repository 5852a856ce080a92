//! The loaded kernel functions and the one way to launch them.
//!
//! It owns the mapping from kernel names to the compiled modules and the
//! kernel-argument ABI (`Arg`, `RopeFreqs`); it must not decide what to
//! launch (that is the operation modules' job).

use std::collections::HashMap;
use std::sync::Arc;

use std::ffi::c_void;
use std::ptr;

use cudarc::driver::{CudaContext, CudaFunction, CudaStream, sys};
use cudarc::nvrtc::Ptx;

use crate::CudaError;
use crate::compile::{SOURCES, cubin, recompile};

/// Threads per block of the element-wise kernels.
pub const BLOCK: u32 = 256;

/// The preferred shared-memory carveout, in percent of the most an SM
/// gives (228 KB on sm_90), of every kernel but flash attention's. Left to
/// the driver, each kernel gets the split of L1 and shared memory that its
/// own blocks favour, and a decode step's kernels favour different ones.
/// An SM can change its split only when it is idle, so (the likely
/// mechanism; the figures fit it, nothing documents it) a kernel whose
/// split differs from its predecessor's is not resident beside that
/// predecessor's last blocks, and programmatic dependent launch loses the
/// overlap it is there for. One preference for every kernel keeps one
/// split through the step, as long as every block fits it: a block that
/// needs more shared memory than the split holds gets a larger one all the
/// same, and the switches come back (the int8 ring's cap,
/// `gemv::QX_STREAM_MAX_SHARED`, is sized to fit). 60% asks for 137 KB,
/// which sm_90 rounds up to its 164 KB configuration (92 KB of L1); 50%
/// gives 132 KB (124 KB of L1). On the H200 (BENCHMARKS.md, forty-sixth
/// session), Llama-3.1-8B int4 decode: the tensor-core attention 493
/// tok/s left to the driver, 550 at 50, 549 at 60; at 100 (28 KB of L1)
/// 504-521, at 0 383. At 60 rather than 50, a streamed bf16 GEMV's 113 KB
/// block leaves room for the next launch's blocks beside it, and the int8
/// ring fits with four stages: on an H100 (forty-seventh session) bf16
/// +0.8%, int8 +0.6% (with the 158 KB cap; a 126 KB ring at 50, three
/// stages, lost 0.4%), int4 and gpt-oss-20b level. Flash attention
/// (prefill) keeps the driver's choice: at 50 prefill lost 4% (two of its
/// 68 KB blocks fit an SM only past 132 KB), and it was not measured at 60.
pub(crate) const CARVEOUT_PERCENT: i32 = 60;

/// The RoPE kernel's by-value table (`struct RopeFreqs` in kernels/rope_kv.cu):
/// inv_freq for up to 256 pairs, i.e. head_dim ≤ 512.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RopeFreqs(pub [f32; 256]);

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
    Segs(Box<crate::gemv::GemvSegs>),
    /// A sampling filter, by value (`struct Keep` in kernels/sample.cu).
    Keep(KeepArg),
    /// What a decode step's fused attention kernel does besides attention,
    /// by value (`struct GqaStep` in kernels/attention.cu).
    Step(Box<crate::attention::GqaStep>),
}

/// `struct Keep` of kernels/sample.cu: which candidates a bucket pass
/// counts (`turbospark_backend::scores::Keep`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KeepArg {
    pub min_w: f64,
    pub has_last: u32,
    pub last_s: f32,
    pub last_id: u32,
}

macro_rules! kernels {
    ($($file:literal => [$($name:ident),* $(,)?]),* $(,)?) => {
        /// Every kernel, named as in its `.cu` file.
        pub struct Kernels {
            $($(pub $name: CudaFunction,)*)*
        }

        /// Each kernel file and the kernels [`Kernels::load`] takes from
        /// it, so that a machine without a GPU can check that every name
        /// is in its file's cubin (tests/kernels_compile.rs).
        pub const NAMES: &[(&str, &[&str])] = &[$(($file, &[$(stringify!($name)),*])),*];

        impl Kernels {
            /// Compiles (or takes from the cache) every kernel file for
            /// `arch` and loads its functions into `ctx`; with `trace` (a
            /// timeline buffer's address, `crate::trace`), points each
            /// module's `ts_trace` at it.
            pub fn load(
                ctx: &Arc<CudaContext>,
                arch: &str,
                trace: Option<(u64, &Arc<CudaStream>)>,
            ) -> Result<Self, CudaError> {
                let mut modules = HashMap::new();
                for (file, source) in SOURCES {
                    let load = |bin: Vec<u8>| ctx.load_module(Ptx::from_binary(bin));
                    let module = match load(cubin(file, source, arch)?) {
                        Ok(m) => m,
                        // A damaged cache entry: compile again and replace it.
                        Err(_) => load(recompile(file, source, arch)?)?,
                    };
                    if let Some((address, stream)) = trace {
                        let mut global = module.get_global("ts_trace", stream)?;
                        stream.memcpy_htod(&address.to_le_bytes(), &mut global)?;
                        stream.synchronize()?;
                    }
                    modules.insert(file, module);
                }
                let k = Kernels {
                    $($($name: modules[$file].load_function(stringify!($name))?,)*)*
                };
                $($(if $file != "flash_attention.cu" {
                    k.$name.set_attribute(
                        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                        CARVEOUT_PERCENT,
                    )?;
                })*)*
                Ok(k)
            }

            /// The name of the kernel `f` is (a timeline's launch notes).
            pub fn name_of(&self, f: &CudaFunction) -> &'static str {
                $($(if self.$name.cu_function() == f.cu_function() {
                    return stringify!($name);
                })*)*
                "?"
            }
        }
    };
}

kernels! {
    "elementwise.cu" => [embed, add_inplace, scale_inplace, softcap_inplace, glu, add_bias],
    "norm.cu" => [rms_norm],
    "rope_kv.cu" => [rope_kv_write, rope_kv_write_bf16kv],
    "gemv_dense.cu" => [
        gemv_f32, gemv_bf16, gemv_f16, gemv_f32_x1, gemv_bf16_x1, gemv_f16_x1, gemv_bf16_stream,
        gemv_f16_stream,
    ],
    "gemv_grouped.cu" => [
        gemv_mxfp4, gemv_q8, gemv_q4, gemv_mxfp4_x1, gemv_q8_x1, gemv_q4_x1,
        gemv_mxfp4_qx, gemv_q8_qx, gemv_q4_qx,
    ],
    "gemv_grouped_stream.cu" => [gemv_q8_stream],
    "convert.cu" => [split_bf16, to_bf16, widen_f32, mxfp4_to_bf16, dequant_bf16],
    "attention.cu" => [
        attn_partial, attn_gqa_hd64_g8, attn_gqa_hd64_g16, attn_gqa_hd128_g4, attn_gqa_hd128_g8,
        attn_gqa_hd256_g4, attn_gqa_hd64_g8_step, attn_gqa_hd64_g16_step, attn_gqa_hd128_g4_step,
        attn_gqa_hd128_g8_step, attn_gqa_hd256_g4_step, attn_combine,
        attn_partial_bf16kv, attn_gqa_hd64_g8_bf16kv, attn_gqa_hd64_g16_bf16kv,
        attn_gqa_hd128_g4_bf16kv, attn_gqa_hd128_g8_bf16kv, attn_gqa_hd256_g4_bf16kv,
        attn_gqa_hd64_g8_bf16kv_step, attn_gqa_hd64_g16_bf16kv_step,
        attn_gqa_hd128_g4_bf16kv_step, attn_gqa_hd128_g8_bf16kv_step,
        attn_gqa_hd256_g4_bf16kv_step, attn_gqa_hd64_g8_bf16kv_window,
        attn_gqa_hd64_g16_bf16kv_window, attn_gqa_hd64_g8_bf16kv_mma,
        attn_gqa_hd64_g8_bf16kv_mma_step, attn_gqa_hd128_g4_bf16kv_mma,
        attn_gqa_hd128_g4_bf16kv_mma_step, attn_gqa_hd128_g8_bf16kv_mma,
        attn_gqa_hd128_g8_bf16kv_mma_step, attn_gqa_hd64_g8_bf16kv_mma_window,
    ],
    "sample.cu" => [argmax_rows, argmax_feed, score_stats, scores_above, bucket_members, score_buckets, draw_weights],
    "moe.cu" => [moe_route, moe_norm_route, moe_combine, moe_gather, moe_act_rows, moe_combine_rows],
    "flash_attention.cu" => [
        flash_attn_hd64, flash_attn_hd128, flash_attn_hd256, flash_attn_hd64_bf16kv,
        flash_attn_hd128_bf16kv, flash_attn_hd256_bf16kv,
    ],
}

/// Launches `f` on `stream` with `grid` blocks of `block` threads and
/// `shared` bytes of dynamic shared memory a block. With `pdl` the launch
/// allows programmatic dependent launch (sm_90+): the kernel may start
/// while the previous one on the stream drains, and waits for it in
/// `pdl_enter` (kernels/common.cuh), which every kernel calls first.
/// Stream capture keeps the relation as a programmatic graph edge.
///
/// Panics when the launch fails: the backend trait has no error path for
/// operations, and a failed launch means a broken device or a bug.
pub fn launch(
    stream: &CudaStream,
    f: &CudaFunction,
    grid: (u32, u32, u32),
    (block, shared): (u32, u32),
    pdl: bool,
    args: &[Arg],
) {
    // The driver reads each argument through a pointer to its value.
    let mut params: Vec<*mut c_void> = args
        .iter()
        .map(|a| match a {
            Arg::Ptr(v) | Arg::U64(v) => ptr::from_ref(v).cast_mut().cast(),
            Arg::U32(v) => ptr::from_ref(v).cast_mut().cast(),
            Arg::I32(v) => ptr::from_ref(v).cast_mut().cast(),
            Arg::I64(v) => ptr::from_ref(v).cast_mut().cast(),
            Arg::F32(v) => ptr::from_ref(v).cast_mut().cast(),
            Arg::Freqs(v) => ptr::from_ref(v.as_ref()).cast_mut().cast(),
            Arg::Segs(v) => ptr::from_ref(v.as_ref()).cast_mut().cast(),
            Arg::Keep(v) => ptr::from_ref(v).cast_mut().cast(),
            Arg::Step(v) => ptr::from_ref(v.as_ref()).cast_mut().cast(),
        })
        .collect();
    let mut attrs = Vec::with_capacity(1);
    if pdl {
        attrs.push(sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value: sys::CUlaunchAttributeValue {
                programmaticStreamSerializationAllowed: 1,
            },
        });
    }
    let cfg = sys::CUlaunchConfig {
        gridDimX: grid.0,
        gridDimY: grid.1,
        gridDimZ: grid.2,
        blockDimX: block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: shared,
        hStream: stream.cu_stream(),
        attrs: attrs.as_mut_ptr(),
        numAttrs: attrs.len() as u32,
    };
    // SAFETY: every call site passes the arguments of the kernel's C
    // signature, in order and with the C types (see `Arg`); pointers are
    // device addresses of live allocations sized by the caller; `params`
    // and `attrs` outlive the call, which copies them.
    unsafe { sys::cuLaunchKernelEx(&cfg, f.cu_function(), params.as_mut_ptr(), ptr::null_mut()) }
        .result()
        .unwrap_or_else(|e| panic!("CUDA kernel launch failed: {e}"));
}

/// Blocks for a grid-stride kernel over `n` elements.
pub fn grid_for(n: u64) -> (u32, u32, u32) {
    (n.div_ceil(BLOCK as u64).clamp(1, 1 << 20) as u32, 1, 1)
}
