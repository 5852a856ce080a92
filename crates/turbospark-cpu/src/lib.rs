//! The CPU backend: TurboSpark's reference implementation of
//! [`turbospark_backend::Backend`]. f32 arithmetic on f32/bf16/f16 weights
//! (16-bit weights stay 16-bit in memory), multithreaded with rayon, AVX2/FMA
//! inner loops where the processor has them.
//!
//! It owns the CPU storage of activations, weights and KV; it must not know
//! about model families.

pub mod attention;
pub mod linear;
pub mod moe;
pub mod mxfp4;
pub mod ops;
pub mod quant;
pub mod simd;
pub mod storage;
pub mod weight;

use std::collections::VecDeque;

use turbospark_backend::{
    AttnParams, Backend, Experts, KvSpec, MoeParams, Quant, Result, RopeTable,
};
use turbospark_format::{Activation, HostTensor};

pub use attention::{CpuKv, KvRows};
pub use storage::Storage;
pub use weight::{CpuWeight, WeightData};

/// A row-major `[rows, cols]` f32 matrix.
#[derive(Clone, Debug, PartialEq)]
pub struct CpuTensor {
    pub data: Vec<f32>,
    pub rows: usize,
    pub cols: usize,
}

/// The token ids and positions of one forward call (host memory is where
/// the CPU's kernels read them).
#[derive(Clone, Debug, PartialEq)]
pub struct CpuBatch {
    pub tokens: Vec<u32>,
    pub positions: Vec<u32>,
    /// Copies of `tokens` queued by `queue_tokens`, oldest first (work runs
    /// as it is queued here, so a copy is done when made).
    pub queued: VecDeque<Vec<u32>>,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu;

impl Backend for Cpu {
    type Tensor = CpuTensor;
    type Weight = CpuWeight;
    type Kv = CpuKv;
    type Batch = CpuBatch;
    /// The CPU runs work as it is queued: nothing to record.
    type Graph = ();

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn upload(&self, t: &HostTensor<'_>) -> Result<CpuWeight> {
        CpuWeight::from_host(t)
    }

    fn upload_mxfp4(&self, blocks: &HostTensor<'_>, scales: &HostTensor<'_>) -> Result<CpuWeight> {
        CpuWeight::from_mxfp4(blocks, scales)
    }

    fn upload_quantized(&self, t: &HostTensor<'_>, q: Quant, group: usize) -> Result<CpuWeight> {
        CpuWeight::quantized(t, q, group)
    }

    fn upload_f32(&self, values: &[f32], shape: &[usize]) -> Result<CpuWeight> {
        Ok(CpuWeight::from_f32(values, shape))
    }

    fn weight_bytes(&self, w: &CpuWeight) -> usize {
        w.bytes()
    }

    fn tensor(&self, rows: usize, cols: usize) -> CpuTensor {
        CpuTensor {
            data: vec![0.0; rows * cols],
            rows,
            cols,
        }
    }

    fn shape(&self, t: &CpuTensor) -> (usize, usize) {
        (t.rows, t.cols)
    }

    fn to_host(&self, t: &CpuTensor) -> Vec<f32> {
        t.data.clone()
    }

    fn row(&self, src: &CpuTensor, row: usize) -> CpuTensor {
        CpuTensor {
            data: src.data[row * src.cols..(row + 1) * src.cols].to_vec(),
            rows: 1,
            cols: src.cols,
        }
    }

    fn copy(&self, src: &CpuTensor, dst: &mut CpuTensor) {
        assert_eq!(
            (src.rows, src.cols),
            (dst.rows, dst.cols),
            "copy: shapes differ"
        );
        dst.data.copy_from_slice(&src.data);
    }

    fn argmax(&self, t: &CpuTensor) -> Vec<u32> {
        t.data
            .chunks(t.cols.max(1))
            .take(t.rows)
            .map(turbospark_backend::argmax)
            .collect()
    }

    fn batch(&self, tokens: &[u32], positions: &[u32]) -> CpuBatch {
        assert_eq!(
            tokens.len(),
            positions.len(),
            "batch: one position per token"
        );
        CpuBatch {
            tokens: tokens.to_vec(),
            positions: positions.to_vec(),
            queued: VecDeque::new(),
        }
    }

    fn set_batch(&self, b: &mut CpuBatch, tokens: &[u32], positions: &[u32]) {
        assert_eq!(b.tokens.len(), tokens.len(), "set_batch: row count changed");
        *b = self.batch(tokens, positions);
    }

    fn argmax_into_batch(&self, logits: &CpuTensor, b: &mut CpuBatch) {
        assert_eq!(
            logits.rows,
            b.tokens.len(),
            "argmax_into_batch: a row a token"
        );
        b.tokens = self.argmax(logits);
        for p in &mut b.positions {
            *p += 1;
        }
    }

    fn queue_tokens(&self, b: &mut CpuBatch) {
        b.queued.push_back(b.tokens.clone());
    }

    fn take_tokens(&self, b: &mut CpuBatch) -> Vec<u32> {
        b.queued
            .pop_front()
            .expect("take_tokens: no copy of the tokens was queued")
    }

    fn begin_graph(&self) -> bool {
        false
    }

    fn end_graph(&self) -> Option<()> {
        None
    }

    fn replay(&self, _g: &()) {}

    fn embed(&self, table: &CpuWeight, batch: &CpuBatch, out: &mut CpuTensor) {
        ops::embed(table, &batch.tokens, &mut out.data);
    }

    fn rms_norm(&self, x: &CpuTensor, w: &CpuWeight, eps: f32, out: &mut CpuTensor) {
        ops::rms_norm(&x.data, &w.f32_view(), eps, &mut out.data);
    }

    fn linear(&self, x: &CpuTensor, w: &CpuWeight, bias: Option<&CpuWeight>, out: &mut CpuTensor) {
        let bias = bias.map(|b| b.f32_view());
        linear::linear(&x.data, x.rows, w, bias.as_deref(), &mut out.data);
    }

    fn add(&self, x: &mut CpuTensor, y: &CpuTensor) {
        ops::add(&mut x.data, &y.data);
    }

    fn glu(&self, gate: &CpuTensor, up: &CpuTensor, act: Activation, out: &mut CpuTensor) {
        ops::glu(&gate.data, &up.data, act, &mut out.data);
    }

    fn scale(&self, x: &mut CpuTensor, s: f32) {
        x.data.iter_mut().for_each(|v| *v *= s);
    }

    fn softcap(&self, x: &mut CpuTensor, cap: f32) {
        x.data.iter_mut().for_each(|v| *v = ops::softcap(*v, cap));
    }

    fn rope(&self, x: &mut CpuTensor, head_dim: usize, batch: &CpuBatch, rope: &RopeTable) {
        ops::rope(&mut x.data, x.cols, head_dim, &batch.positions, rope);
    }

    fn kv_alloc(&self, spec: KvSpec) -> Result<CpuKv> {
        // Host memory is overcommitted: a store too large fails when
        // written, not here, so there is nothing to check.
        Ok(CpuKv::new(spec))
    }

    fn kv_write(&self, kv: &mut CpuKv, k: &CpuTensor, v: &CpuTensor, batch: &CpuBatch) {
        kv.write(&k.data, &v.data, &batch.positions);
    }

    fn attention(
        &self,
        q: &CpuTensor,
        kv: &CpuKv,
        batch: &CpuBatch,
        params: &AttnParams,
        sinks: Option<&CpuWeight>,
        out: &mut CpuTensor,
    ) {
        let sinks = sinks.map(|s| s.f32_view());
        attention::attention(
            &q.data,
            kv,
            &batch.positions,
            params,
            sinks.as_deref(),
            &mut out.data,
        );
    }

    fn moe(
        &self,
        x: &CpuTensor,
        router_logits: &CpuTensor,
        experts: &Experts<'_, CpuWeight>,
        params: &MoeParams,
        out: &mut CpuTensor,
    ) {
        moe::moe(
            &x.data,
            x.cols,
            &router_logits.data,
            experts,
            params,
            &mut out.data,
        );
    }
}

#[cfg(test)]
mod tests {
    use turbospark_backend::scores::{self, Keep};

    use super::*;

    /// The sampling summaries the CPU backend inherits read the row asked
    /// for: on the second of two rows they equal the host definitions.
    #[test]
    fn summaries_read_the_row_asked_for() {
        let rows = [
            vec![9.0, -9.0, 9.0, -9.0, 9.0],
            vec![0.5, 2.0, f32::NAN, 1.0, 2.0],
        ];
        let t = CpuTensor {
            data: rows.concat(),
            rows: 2,
            cols: 5,
        };
        let (be, row) = (Cpu, &rows[1]);
        assert_eq!(be.score_stats(&t, 1, 0.8), scores::score_stats(row, 0.8));
        assert_eq!(
            be.scores_above(&t, 1, 0.8, 1.0, 8),
            scores::scores_above(row, 0.8, 1.0, 8)
        );
        let keep = Keep::default();
        let max = 2.0 / 0.8;
        assert_eq!(
            be.score_buckets(&t, 1, 0.8, max, &keep, true),
            scores::score_buckets(row, 0.8, max, &keep, true)
        );
        assert_eq!(
            be.bucket_members(&t, 1, 0.8, max, &keep, 0, 8),
            Some(vec![(1, max), (4, max)])
        );
        assert_eq!(be.draw(&t, 1, 0.8, 0.0, 0.99), Some(4));
    }
}
