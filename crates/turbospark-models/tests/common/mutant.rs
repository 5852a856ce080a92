//! A backend that is the CPU backend with one deliberate mistake, to prove
//! that the fixtures notice mistakes no spec field can express (the order
//! of bias and RoPE, the values of the sinks). It wraps [`Cpu`] and changes
//! exactly one operation. One variant is a check rather than a mistake:
//! [`Mistake::NanEmpty`] must go unnoticed.

use std::sync::Mutex;

use turbospark_backend::{
    AttnParams, Backend, Experts, KvSpec, MoeParams, Quant, Result, RopeTable,
};
use turbospark_cpu::{Cpu, CpuBatch, CpuKv, CpuTensor, CpuWeight};
use turbospark_format::{Activation, HostTensor};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mistake {
    /// Add the q/k projection biases after RoPE instead of before.
    BiasAfterRope,
    /// Use zero for every attention sink logit.
    ZeroSinks,
    /// Not a mistake: `empty` tensors hold NaN instead of zeros. The
    /// fixtures still match only if every operation given one writes it
    /// before anything reads it (`Backend::empty`'s contract, on which the
    /// CUDA backend relies).
    NanEmpty,
}

pub struct Mutant {
    pub mistake: Mistake,
    /// The bias last added by `linear` to each output buffer, keyed by the
    /// buffer's address: `rope` finds the bias inside the tensor it rotates.
    biased: Mutex<Vec<(usize, Vec<f32>)>>,
}

impl Mutant {
    pub fn new(mistake: Mistake) -> Self {
        Mutant {
            mistake,
            biased: Mutex::new(Vec::new()),
        }
    }
}

impl Backend for Mutant {
    type Tensor = CpuTensor;
    type Weight = CpuWeight;
    type Kv = CpuKv;
    type Batch = CpuBatch;
    type Graph = ();

    fn name(&self) -> &'static str {
        "cpu-mutant"
    }
    fn upload(&self, t: &HostTensor<'_>) -> Result<CpuWeight> {
        Cpu.upload(t)
    }
    fn upload_mxfp4(&self, b: &HostTensor<'_>, s: &HostTensor<'_>) -> Result<CpuWeight> {
        Cpu.upload_mxfp4(b, s)
    }
    fn upload_quantized(&self, t: &HostTensor<'_>, q: Quant, group: usize) -> Result<CpuWeight> {
        Cpu.upload_quantized(t, q, group)
    }
    fn upload_f32(&self, v: &[f32], shape: &[usize]) -> Result<CpuWeight> {
        Cpu.upload_f32(v, shape)
    }
    fn weight_bytes(&self, w: &CpuWeight) -> usize {
        Cpu.weight_bytes(w)
    }
    fn tensor(&self, rows: usize, cols: usize) -> CpuTensor {
        Cpu.tensor(rows, cols)
    }
    fn empty(&self, rows: usize, cols: usize) -> CpuTensor {
        let mut t = Cpu.tensor(rows, cols);
        if self.mistake == Mistake::NanEmpty {
            t.data.fill(f32::NAN);
        }
        t
    }
    fn shape(&self, t: &CpuTensor) -> (usize, usize) {
        Cpu.shape(t)
    }
    fn to_host(&self, t: &CpuTensor) -> Vec<f32> {
        Cpu.to_host(t)
    }
    fn row(&self, src: &CpuTensor, row: usize) -> CpuTensor {
        Cpu.row(src, row)
    }
    fn copy(&self, src: &CpuTensor, dst: &mut CpuTensor) {
        Cpu.copy(src, dst)
    }
    fn argmax(&self, t: &CpuTensor) -> Vec<u32> {
        Cpu.argmax(t)
    }
    fn batch(&self, tokens: &[u32], positions: &[u32]) -> CpuBatch {
        Cpu.batch(tokens, positions)
    }
    fn set_batch(&self, b: &mut CpuBatch, tokens: &[u32], positions: &[u32]) {
        Cpu.set_batch(b, tokens, positions)
    }
    fn argmax_into_batch(&self, logits: &CpuTensor, b: &mut CpuBatch) {
        Cpu.argmax_into_batch(logits, b)
    }
    fn queue_tokens(&self, b: &mut CpuBatch) {
        Cpu.queue_tokens(b)
    }
    fn take_tokens(&self, b: &mut CpuBatch) -> Vec<u32> {
        Cpu.take_tokens(b)
    }
    fn begin_graph(&self) -> bool {
        false
    }
    fn end_graph(&self) -> Option<()> {
        None
    }
    fn replay(&self, _g: &()) {}
    fn embed(&self, table: &CpuWeight, batch: &CpuBatch, out: &mut CpuTensor) {
        Cpu.embed(table, batch, out)
    }
    fn rms_norm(&self, x: &CpuTensor, w: &CpuWeight, eps: f32, out: &mut CpuTensor) {
        Cpu.rms_norm(x, w, eps, out)
    }
    fn linear(&self, x: &CpuTensor, w: &CpuWeight, bias: Option<&CpuWeight>, out: &mut CpuTensor) {
        Cpu.linear(x, w, bias, out);
        if let (Mistake::BiasAfterRope, Some(b)) = (self.mistake, bias) {
            let mut biased = self.biased.lock().unwrap();
            let key = out.data.as_ptr() as usize;
            biased.retain(|(k, _)| *k != key);
            biased.push((key, b.to_f32()));
        }
    }
    fn add(&self, x: &mut CpuTensor, y: &CpuTensor) {
        Cpu.add(x, y)
    }
    fn glu(&self, g: &CpuTensor, u: &CpuTensor, act: Activation, out: &mut CpuTensor) {
        Cpu.glu(g, u, act, out)
    }
    fn scale(&self, x: &mut CpuTensor, s: f32) {
        Cpu.scale(x, s)
    }
    fn softcap(&self, x: &mut CpuTensor, cap: f32) {
        Cpu.softcap(x, cap)
    }
    fn rope(&self, x: &mut CpuTensor, head_dim: usize, batch: &CpuBatch, rope: &RopeTable) {
        let key = x.data.as_ptr() as usize;
        let bias = self
            .biased
            .lock()
            .unwrap()
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, b)| b.clone());
        let Some(b) = bias else {
            return Cpu.rope(x, head_dim, batch, rope);
        };
        // Take the bias out, rotate, put it back: rotate(xW) + b.
        let shift = |x: &mut CpuTensor, sign: f32| {
            for row in x.data.chunks_exact_mut(b.len()) {
                row.iter_mut().zip(&b).for_each(|(v, bb)| *v += sign * bb);
            }
        };
        shift(x, -1.0);
        Cpu.rope(x, head_dim, batch, rope);
        shift(x, 1.0);
    }
    fn kv_alloc(&self, spec: KvSpec) -> turbospark_backend::Result<CpuKv> {
        Cpu.kv_alloc(spec)
    }
    fn kv_write(&self, kv: &mut CpuKv, k: &CpuTensor, v: &CpuTensor, batch: &CpuBatch) {
        Cpu.kv_write(kv, k, v, batch)
    }
    fn attention(
        &self,
        q: &CpuTensor,
        kv: &CpuKv,
        batch: &CpuBatch,
        p: &AttnParams,
        sinks: Option<&CpuWeight>,
        out: &mut CpuTensor,
    ) {
        match (self.mistake, sinks) {
            (Mistake::ZeroSinks, Some(s)) => {
                let zeros = CpuWeight::from_f32(&vec![0.0; s.numel()], &s.shape);
                Cpu.attention(q, kv, batch, p, Some(&zeros), out)
            }
            _ => Cpu.attention(q, kv, batch, p, sinks, out),
        }
    }
    fn moe(
        &self,
        x: &CpuTensor,
        l: &CpuTensor,
        e: &Experts<'_, CpuWeight>,
        p: &MoeParams,
        out: &mut CpuTensor,
    ) {
        Cpu.moe(x, l, e, p, out)
    }
}
