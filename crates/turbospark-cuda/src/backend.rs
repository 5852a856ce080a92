//! The trait's dispatch: [`Backend`] for [`Cuda`], each operation handed to
//! the module that owns its kernels (`linear`, `ops`, `attention`, `moe`,
//! `sample`, ...) or, for tensors, buffers and recorded graphs, to the
//! device handle's own helpers in the crate root. It must not launch
//! kernels itself or hold numerics of its own.

use std::sync::atomic::Ordering;

use cudarc::driver::sys;
use turbospark_backend::scores::Keep;
use turbospark_backend::{
    AttnParams, Backend, Experts, KvDtype, KvSpec, MoeParams, Quant, Result, RopeTable, ScoreStats,
};
use turbospark_format::{Activation, DType, HostTensor};

use crate::arena::Arena;
use crate::memory::{Purpose, unwind_on_error};
use crate::recording::{Capture, Recording};
use crate::{
    Cuda, CudaBatch, CudaKv, CudaTensor, CudaWeight, Precision, attention, linear, moe, ops,
    rope_kv, sample,
};

impl Backend for Cuda {
    type Tensor = CudaTensor;
    type Weight = CudaWeight;
    type Kv = CudaKv;
    type Batch = CudaBatch;
    type Graph = Recording;

    fn name(&self) -> &'static str {
        "cuda"
    }

    /// 2048: each chunk reads every weight once (and converts MXFP4 and
    /// int8/int4 weights to bf16 once), and an MoE layer synchronises with
    /// the host once per chunk, so larger chunks amortise those costs and
    /// give each expert's GEMM more rows; the activations of 2048 rows
    /// (e.g. 2 × 117 MB for Llama-3.1-8B's MLP) and rings of `window + 2048`
    /// rows are small beside a GPU's memory.
    fn prefill_chunk(&self) -> usize {
        2048
    }

    fn upload(&self, t: &HostTensor<'_>) -> Result<CudaWeight> {
        CudaWeight::from_host(self, t)
    }

    fn upload_mxfp4(&self, blocks: &HostTensor<'_>, scales: &HostTensor<'_>) -> Result<CudaWeight> {
        CudaWeight::from_mxfp4(self, blocks, scales)
    }

    fn upload_quantized(&self, t: &HostTensor<'_>, q: Quant, group: usize) -> Result<CudaWeight> {
        let w = CudaWeight::quantized(self, t, q, group)?;
        if q == Quant::Int4 {
            self.int4_linears.store(true, Ordering::Relaxed);
        }
        Ok(w)
    }

    fn upload_f32(&self, values: &[f32], shape: &[usize]) -> Result<CudaWeight> {
        CudaWeight::from_f32(self, values, shape)
    }

    fn weight_bytes(&self, w: &CudaWeight) -> usize {
        w.bytes()
    }

    fn tensor(&self, rows: usize, cols: usize) -> CudaTensor {
        CudaTensor {
            data: self.zeros(rows * cols),
            rows,
            cols,
        }
    }

    /// No zeroing: in a recorded step a memset node would sit between two
    /// kernels (BENCHMARKS.md, twenty-third session: gpt-oss-20b decoded
    /// 460.3 tok/s with them, 502.8 without).
    fn empty(&self, rows: usize, cols: usize) -> CudaTensor {
        CudaTensor {
            data: self.scratch(rows * cols),
            rows,
            cols,
        }
    }

    fn shape(&self, t: &CudaTensor) -> (usize, usize) {
        (t.rows, t.cols)
    }

    fn to_host(&self, t: &CudaTensor) -> Vec<f32> {
        let n = t.rows * t.cols;
        if n == 0 {
            return Vec::new();
        }
        self.stream
            .clone_dtoh(&t.data.slice(..n))
            .unwrap_or_else(|e| panic!("CUDA: copying a tensor to the host: {e}"))
    }

    fn row(&self, src: &CudaTensor, row: usize) -> CudaTensor {
        assert!(row < src.rows, "row {row} of a {}-row tensor", src.rows);
        let c = src.cols;
        let mut out = self.empty(1, c);
        if c > 0 {
            self.stream
                .memcpy_dtod(
                    &src.data.slice(row * c..(row + 1) * c),
                    &mut out.data.slice_mut(..c),
                )
                .unwrap_or_else(|e| panic!("CUDA: copying a row: {e}"));
        }
        out
    }

    fn copy(&self, src: &CudaTensor, dst: &mut CudaTensor) {
        assert_eq!(
            (src.rows, src.cols),
            (dst.rows, dst.cols),
            "copy: shapes differ"
        );
        let n = src.rows * src.cols;
        if n > 0 {
            self.stream
                .memcpy_dtod(&src.data.slice(..n), &mut dst.data.slice_mut(..n))
                .unwrap_or_else(|e| panic!("CUDA: copying a tensor: {e}"));
        }
    }

    fn argmax(&self, t: &CudaTensor) -> Vec<u32> {
        sample::argmax(self, t)
    }

    fn score_stats(&self, logits: &CudaTensor, row: usize, t: f32) -> ScoreStats {
        sample::score_stats(self, logits, row, t)
    }

    fn scores_above(
        &self,
        logits: &CudaTensor,
        row: usize,
        t: f32,
        floor: f32,
        cap: usize,
    ) -> Option<Vec<(u32, f32)>> {
        sample::scores_above(self, logits, row, t, floor, cap)
    }

    fn score_buckets(
        &self,
        logits: &CudaTensor,
        row: usize,
        t: f32,
        max: f32,
        keep: &Keep,
        rounded: bool,
    ) -> Vec<f64> {
        sample::score_buckets(self, logits, row, t, max, keep, rounded)
    }

    fn bucket_members(
        &self,
        logits: &CudaTensor,
        row: usize,
        t: f32,
        max: f32,
        keep: &Keep,
        bucket: usize,
        cap: usize,
    ) -> Option<Vec<(u32, f32)>> {
        sample::bucket_members(self, logits, row, t, max, keep, bucket, cap)
    }

    fn draw(&self, logits: &CudaTensor, row: usize, t: f32, min_w: f64, u: f64) -> Option<u32> {
        sample::draw(self, logits, row, t, min_w, u)
    }

    fn summarizes_scores(&self) -> bool {
        true
    }

    fn batch(&self, tokens: &[u32], positions: &[u32]) -> CudaBatch {
        CudaBatch::new(self, tokens, positions)
    }

    fn set_batch(&self, b: &mut CudaBatch, tokens: &[u32], positions: &[u32]) {
        b.set(self, tokens, positions)
    }

    fn argmax_into_batch(&self, logits: &CudaTensor, b: &mut CudaBatch) {
        sample::argmax_into_batch(self, logits, b)
    }

    fn queue_tokens(&self, b: &mut CudaBatch) {
        b.queue_tokens(self)
    }

    fn take_tokens(&self, b: &mut CudaBatch) -> Vec<u32> {
        b.take_tokens()
    }

    fn begin_graph(&self) -> bool {
        // Thread-local mode: another thread's unrelated CUDA calls do not
        // invalidate this capture.
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        if self.stream.begin_capture(mode).is_err() {
            return false;
        }
        *self.capture.lock().unwrap_or_else(|e| e.into_inner()) = Some(Capture {
            arena: Arena::new(self.stream.clone()),
            steps: Vec::new(),
        });
        self.recording.store(true, Ordering::Relaxed);
        true
    }

    fn end_graph(&self) -> Option<Recording> {
        self.recording.store(false, Ordering::Relaxed);
        let capture = self
            .capture
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let flags = sys::CUgraphInstantiate_flags(0);
        match (self.stream.end_capture(flags), capture) {
            (Ok(Some(graph)), Some(Capture { arena, steps })) => Some(Recording {
                graph,
                arena,
                steps,
            }),
            _ => None,
        }
    }

    fn replay(&self, g: &Recording) {
        // A step's buffers are its arena's, but one whose arena could not
        // grow took pool memory, which the driver allocates at launch.
        let what = || "the buffers of a recorded decode step".to_string();
        unwind_on_error(self.try_alloc(0, &Purpose::forward(&what), || g.graph.launch()));
        g.count_replay();
    }

    fn embed(&self, table: &CudaWeight, batch: &CudaBatch, out: &mut CudaTensor) {
        ops::embed(self, table, batch, out);
    }

    fn rms_norm(&self, x: &CudaTensor, w: &CudaWeight, eps: f32, out: &mut CudaTensor) {
        ops::rms_norm(self, x, w, eps, out);
    }

    fn linear(
        &self,
        x: &CudaTensor,
        w: &CudaWeight,
        bias: Option<&CudaWeight>,
        out: &mut CudaTensor,
    ) {
        linear::linear(self, x, w, bias, out);
    }

    fn linears(
        &self,
        x: &CudaTensor,
        parts: &[(&CudaWeight, Option<&CudaWeight>)],
        outs: &mut [&mut CudaTensor],
    ) {
        linear::linears(self, x, parts, outs);
    }

    fn add(&self, x: &mut CudaTensor, y: &CudaTensor) {
        ops::add(self, x, y);
    }

    fn rms_norm_linears(
        &self,
        x: &CudaTensor,
        w: &CudaWeight,
        eps: f32,
        parts: &[(&CudaWeight, Option<&CudaWeight>)],
        outs: &mut [&mut CudaTensor],
        normed: Option<&mut CudaTensor>,
    ) {
        linear::rms_norm_linears(self, x, w, eps, parts, outs, normed);
    }

    fn linear_add(
        &self,
        x: &CudaTensor,
        w: &CudaWeight,
        bias: Option<&CudaWeight>,
        acc: &mut CudaTensor,
    ) {
        linear::linear_add(self, x, w, bias, acc);
    }

    fn glu(&self, gate: &CudaTensor, up: &CudaTensor, act: Activation, out: &mut CudaTensor) {
        ops::glu(self, gate, up, act, out);
    }

    fn rms_norm_glu(
        &self,
        x: &CudaTensor,
        w: &CudaWeight,
        eps: f32,
        gate: (&CudaWeight, Option<&CudaWeight>),
        up: (&CudaWeight, Option<&CudaWeight>),
        act: Activation,
        out: &mut CudaTensor,
    ) {
        linear::rms_norm_glu(self, x, w, eps, (gate, up), act, out);
    }

    fn scale(&self, x: &mut CudaTensor, s: f32) {
        ops::scale(self, x, s);
    }

    fn softcap(&self, x: &mut CudaTensor, cap: f32) {
        ops::softcap(self, x, cap);
    }

    fn rope(&self, x: &mut CudaTensor, head_dim: usize, batch: &CudaBatch, rope: &RopeTable) {
        rope_kv::rope(self, x, head_dim, batch, rope);
    }

    /// vLLM's `auto`: a bf16 model keeps a bf16 store at
    /// `Precision::Bf16` (half the bytes a decode step's attention reads);
    /// f32 and f16 models, and `Precision::F32`, keep f32 (an f16 model's
    /// values would lose three bits in bf16).
    fn kv_dtype(&self, model: DType) -> KvDtype {
        match (self.precision, model) {
            (Precision::Bf16, DType::BF16) => KvDtype::Bf16,
            _ => KvDtype::F32,
        }
    }

    fn kv_alloc(&self, spec: KvSpec) -> Result<CudaKv> {
        CudaKv::new(self, spec)
    }

    fn kv_write(&self, kv: &mut CudaKv, k: &CudaTensor, v: &CudaTensor, batch: &CudaBatch) {
        rope_kv::kv_write(self, kv, k, v, batch);
    }

    fn rope_kv_write(
        &self,
        q: &mut CudaTensor,
        k: &mut CudaTensor,
        v: &CudaTensor,
        kv: &mut CudaKv,
        head_dim: usize,
        batch: &CudaBatch,
        rope: &RopeTable,
    ) {
        rope_kv::rope_kv_write(self, q, k, v, kv, head_dim, batch, rope);
    }

    fn attention(
        &self,
        q: &CudaTensor,
        kv: &CudaKv,
        batch: &CudaBatch,
        params: &AttnParams,
        sinks: Option<&CudaWeight>,
        out: &mut CudaTensor,
    ) {
        attention::attention(self, q, kv, batch, params, sinks, out);
    }

    fn rope_kv_attention(
        &self,
        qkv: (&mut CudaTensor, &mut CudaTensor, &CudaTensor),
        kv: &mut CudaKv,
        batch: &CudaBatch,
        rope: &RopeTable,
        params: &AttnParams,
        sinks: Option<&CudaWeight>,
        out: &mut CudaTensor,
    ) {
        attention::rope_kv_attention(self, qkv, kv, batch, rope, params, sinks, out);
    }

    fn moe(
        &self,
        x: &CudaTensor,
        router_logits: &CudaTensor,
        experts: &Experts<'_, CudaWeight>,
        params: &MoeParams,
        out: &mut CudaTensor,
    ) {
        moe::moe(self, x, router_logits, experts, params, out);
    }

    fn rms_norm_moe(
        &self,
        x: &mut CudaTensor,
        norm: &CudaWeight,
        eps: f32,
        router: (&CudaWeight, Option<&CudaWeight>),
        experts: &Experts<'_, CudaWeight>,
        params: &MoeParams,
    ) {
        moe::rms_norm_moe(self, x, norm, eps, router, experts, params);
    }
}
