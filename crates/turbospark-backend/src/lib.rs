//! The backend trait: every operation a transformer forward pass needs, in
//! terms of device-resident activations, weights and KV storage.
//!
//! Families are written once over [`Backend`]; the CPU backend
//! (`turbospark-cpu`) is the reference implementation and a CUDA backend
//! implements the same trait. This crate holds the contract, the plain-data
//! parameter types and the host-side definition of the quantized weight
//! format (so every backend holds identical codes); it must not contain
//! device arithmetic.

pub mod mxfp4;
pub mod quant;
pub mod scores;

pub use mxfp4::mxfp4_shape;
pub use quant::{QUANT_GROUP, Quant, SCALE_GROUPS};
pub use scores::ScoreStats;

use turbospark_format::{Activation, AttnSpan, DType, ExpertAct, FormatError, HostTensor, Routing};

/// Errors a backend can raise while building weights or buffers.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error("{0}")]
    Unsupported(String),
    /// An allocation the device (or host) could not make: a model or a
    /// context too large for it. The message says how much was asked, how
    /// much the device has, and what to change.
    #[error(
        "out of {device} memory: {what}{}, {}; {hint}",
        needs(*.need),
        .free.map_or_else(|| "the allocation failed".to_string(), |(free, total)| format!("{} free of {}", gib(free), gib(total)))
    )]
    OutOfMemory {
        /// "GPU" or "host".
        device: &'static str,
        /// What was being allocated, e.g. "tensor `model.embed_tokens.weight`".
        what: String,
        /// Bytes asked for; 0 where the driver does not say (a graph's launch).
        need: u64,
        /// (free, total) bytes of the device, where it can say.
        free: Option<(u64, u64)>,
        hint: &'static str,
    },
    /// A device operation other than an allocation failed.
    #[error("{0}")]
    Device(String),
}

/// " needs N more" for an allocation of `need` bytes, nothing where unknown (0).
fn needs(need: u64) -> String {
    if need == 0 {
        String::new()
    } else {
        format!(" needs {} more", gib(need))
    }
}

/// Bytes as GiB with two decimals (MiB, KiB, bytes below those), for
/// memory messages.
fn gib(bytes: u64) -> String {
    let b = bytes as f64;
    match bytes {
        0..0x400 => format!("{bytes} bytes"),
        0x400..0x10_0000 => format!("{:.1} KiB", b / 1024.0),
        0x10_0000..0x4000_0000 => format!("{:.1} MiB", b / f64::from(1 << 20)),
        _ => format!("{:.2} GiB", b / f64::from(1 << 30)),
    }
}

/// The hint of an [`BackendError::OutOfMemory`] raised while loading weights.
pub const WEIGHTS_HINT: &str = "load fewer bytes (--quant int8 or int4, a smaller model) or run on another device (--device cpu)";
/// The hint of an [`BackendError::OutOfMemory`] raised while allocating a
/// KV cache of bf16 keys and values.
pub const KV_HINT: &str = "lower --context or free memory on the device";
/// The same for a KV cache of f32 keys and values, which bf16 halves.
pub const KV_F32_HINT: &str = "lower --context, keep keys and values in bf16 (--kv-cache-dtype bf16), or free memory on the device";

pub type Result<T> = std::result::Result<T, BackendError>;

/// Rotary embedding tables for one attention geometry: `inv_freq[i]` for each
/// of the `head_dim / 2` pairs, and the factor applied to cos and sin.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeTable {
    pub inv_freq: Vec<f32>,
    pub attention_factor: f32,
}

/// The geometry and options of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttnParams {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Multiplies q·k before the softmax.
    pub scale: f32,
    pub span: AttnSpan,
    /// `cap · tanh(s / cap)` on each scaled score before the mask (Gemma 2).
    pub softcap: Option<f32>,
}

/// The geometry and options of one mixture-of-experts call.
#[derive(Clone, Copy, Debug)]
pub struct MoeParams {
    pub num_experts: usize,
    pub top_k: usize,
    /// Width of one expert's hidden layer.
    pub width: usize,
    pub routing: Routing,
    pub act: ExpertAct,
}

/// One layer's experts: `gate_up` is `[experts, 2·width, hidden]` and `down`
/// `[experts, hidden, width]` (rows are outputs), in any weight format.
pub struct Experts<'a, W> {
    pub gate_up: &'a W,
    pub gate_up_bias: Option<&'a W>,
    pub down: &'a W,
    pub down_bias: Option<&'a W>,
}

/// Shape of one layer's KV storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvSpec {
    /// Rows (token slots). A full layer needs the whole context; a sliding
    /// layer needs `window + longest prefill chunk` and is used as a ring.
    pub capacity: usize,
    pub kv_dim: usize,
    pub dtype: KvDtype,
}

/// How a KV store keeps its key and value rows. Attention reads them back
/// widened to f32 and computes in f32 either way; `Bf16` rounds each value
/// once, when it is stored (round to nearest even, as `half::bf16::from_f32`
/// and the GPU's `cvt.rn.bf16.f32`), so every backend storing bf16 attends
/// over the same values. It halves the store and the bytes a decode step
/// reads, as llama.cpp's f16 cache and vLLM's `auto` (the model's dtype) do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvDtype {
    #[default]
    F32,
    Bf16,
}

impl KvDtype {
    /// Bytes of one stored value.
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::Bf16 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::Bf16 => "bf16",
        }
    }
}

/// Index of the first maximum of `logits`. NaN never wins; empty or all-NaN
/// input gives `0`, all `-inf` gives `0`.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in logits.iter().enumerate() {
        let better = match best {
            None => !v.is_nan(),
            Some((_, b)) => v > b,
        };
        if better {
            best = Some((i, v));
        }
    }
    best.map_or(0, |(i, _)| i as u32)
}

/// Row `row` of `logits` copied to the host (the whole tensor comes back,
/// as `Backend::to_host` reads it; the other rows are dropped): what the
/// default sampling summaries read, and what a sampler reads where the
/// summaries cannot settle a draw.
pub fn host_row<B: Backend + ?Sized>(be: &B, logits: &B::Tensor, row: usize) -> Vec<f32> {
    let cols = be.shape(logits).1;
    let mut all = be.to_host(logits);
    all.truncate((row + 1) * cols);
    all.drain(..row * cols);
    all
}

/// `(rms_norm(x), rms_norm(x) · Rᵀ (+ rb))` for `router` = (R, rb): an MoE
/// block's normed rows and router logits, from the router projection
/// through the norm ([`Backend::rms_norm_linears`], which also writes the
/// normed rows).
pub fn rms_norm_route<B: Backend + ?Sized>(
    be: &B,
    x: &B::Tensor,
    norm: &B::Weight,
    eps: f32,
    router: (&B::Weight, Option<&B::Weight>),
    num_experts: usize,
) -> (B::Tensor, B::Tensor) {
    let (rows, cols) = be.shape(x);
    let mut logits = be.empty(rows, num_experts);
    let mut normed = be.empty(rows, cols);
    be.rms_norm_linears(
        x,
        norm,
        eps,
        &[router],
        &mut [&mut logits],
        Some(&mut normed),
    );
    (normed, logits)
}

/// `x += moe(rms_norm(x))`, routed by `rms_norm(x) · Rᵀ (+ rb)`:
/// [`rms_norm_route`], then [`Backend::moe`] into `x`. What
/// [`Backend::rms_norm_moe`] does unless a backend fuses it.
pub fn rms_norm_moe_parts<B: Backend + ?Sized>(
    be: &B,
    x: &mut B::Tensor,
    norm: &B::Weight,
    eps: f32,
    router: (&B::Weight, Option<&B::Weight>),
    experts: &Experts<'_, B::Weight>,
    params: &MoeParams,
) {
    let (normed, logits) = rms_norm_route(be, x, norm, eps, router, params.num_experts);
    be.moe(&normed, &logits, experts, params, x);
}

/// The operations a transformer needs.
///
/// Activations are row-major `[rows, cols]` f32 matrices (`rows` = tokens).
/// Weights are matrices `[out, in]` as stored by transformers (a projection
/// computes `x · Wᵀ`) or vectors, kept in the storage format the backend chose
/// at upload. Positions are absolute token positions in the sequence; the
/// token ids and positions of one forward call travel as a [`Backend::Batch`].
pub trait Backend: Send + Sync {
    type Tensor: Send;
    type Weight: Send + Sync;
    type Kv: Send;
    /// The token ids and positions of the rows of one forward call, stored
    /// where the backend's kernels read them (uploaded once per call, not
    /// once per layer).
    type Batch: Send;
    /// A recording of queued work that can be replayed (a CUDA graph).
    type Graph: Send;

    fn name(&self) -> &'static str;

    /// Prompt tokens per batched forward call. 512 by default: large enough
    /// that prefill runs as matrix-matrix products, bounded so activations
    /// and the sliding rings (`window + chunk` rows) stay small.
    fn prefill_chunk(&self) -> usize {
        512
    }

    /// Makes a device weight from checkpoint bytes (any supported dtype).
    fn upload(&self, t: &HostTensor<'_>) -> Result<Self::Weight>;
    /// Makes a weight `[.., rows, cols]` from MXFP4 checkpoint tensors:
    /// `blocks` u8 `[.., rows, cols/32, 16]` (two E2M1 codes a byte, low
    /// nibble first) and `scales` u8 `[.., rows, cols/32]` (E8M0, 2^(s−127)).
    /// It stays packed in memory.
    fn upload_mxfp4(
        &self,
        blocks: &HostTensor<'_>,
        scales: &HostTensor<'_>,
    ) -> Result<Self::Weight>;
    /// Makes a quantized weight from a 2-D checkpoint matrix whose rows are
    /// a multiple of [`QUANT_GROUP`] wide, one scale a `group` values (one
    /// of [`SCALE_GROUPS`]; rows it does not divide take the largest one
    /// that does: `quant::scale_group_for`).
    fn upload_quantized(&self, t: &HostTensor<'_>, q: Quant, group: usize) -> Result<Self::Weight>;
    /// A weight from f32 values (tables computed at load).
    fn upload_f32(&self, values: &[f32], shape: &[usize]) -> Result<Self::Weight>;
    /// Bytes the weight occupies on the device.
    fn weight_bytes(&self, w: &Self::Weight) -> usize;

    /// A `[rows, cols]` tensor of zeros.
    fn tensor(&self, rows: usize, cols: usize) -> Self::Tensor;
    /// A `[rows, cols]` tensor for an operation that writes every element
    /// before anything reads it (an output that is overwritten, never
    /// added into): its contents are unspecified. Zeros ([`Backend::tensor`])
    /// unless a backend skips the zeroing, as the CUDA backend does: in a
    /// recorded decode step each zeroing is a memset node between two
    /// kernels, which costs its own launch and keeps the second kernel from
    /// starting while the first drains.
    fn empty(&self, rows: usize, cols: usize) -> Self::Tensor {
        self.tensor(rows, cols)
    }
    fn shape(&self, t: &Self::Tensor) -> (usize, usize);
    fn to_host(&self, t: &Self::Tensor) -> Vec<f32>;
    /// Copies row `row` of `src` into row 0 of a new one-row tensor.
    fn row(&self, src: &Self::Tensor, row: usize) -> Self::Tensor;
    /// `dst = src` (same shape).
    fn copy(&self, src: &Self::Tensor, dst: &mut Self::Tensor);
    /// [`argmax`] of each row: greedy decoding without copying the
    /// logits to the host.
    fn argmax(&self, t: &Self::Tensor) -> Vec<u32>;
    /// [`scores::score_stats`] of row `row` of `logits` scaled by `1 / t`.
    fn score_stats(&self, logits: &Self::Tensor, row: usize, t: f32) -> ScoreStats {
        scores::score_stats(&host_row(self, logits, row), t)
    }
    /// [`scores::scores_above`] of row `row` of `logits` scaled by `1 / t`.
    fn scores_above(
        &self,
        logits: &Self::Tensor,
        row: usize,
        t: f32,
        floor: f32,
        cap: usize,
    ) -> Option<Vec<(u32, f32)>> {
        scores::scores_above(&host_row(self, logits, row), t, floor, cap)
    }
    /// [`scores::score_buckets`] of row `row` of `logits` scaled by `1 / t`.
    fn score_buckets(
        &self,
        logits: &Self::Tensor,
        row: usize,
        t: f32,
        max: f32,
        keep: &scores::Keep,
        rounded: bool,
    ) -> Vec<f64> {
        scores::score_buckets(&host_row(self, logits, row), t, max, keep, rounded)
    }
    /// [`scores::bucket_members`] of row `row` of `logits` scaled by `1 / t`.
    #[allow(clippy::too_many_arguments)]
    fn bucket_members(
        &self,
        logits: &Self::Tensor,
        row: usize,
        t: f32,
        max: f32,
        keep: &scores::Keep,
        bucket: usize,
        cap: usize,
    ) -> Option<Vec<(u32, f32)>> {
        scores::bucket_members(&host_row(self, logits, row), t, max, keep, bucket, cap)
    }
    /// [`scores::draw`] from row `row` of `logits` scaled by `1 / t`, over
    /// the candidates weighing at least `min_w`.
    fn draw(&self, logits: &Self::Tensor, row: usize, t: f32, min_w: f64, u: f64) -> Option<u32> {
        scores::draw(&host_row(self, logits, row), t, min_w, u)
    }
    /// Whether [`Backend::score_stats`], [`Backend::scores_above`],
    /// [`Backend::score_buckets`], [`Backend::bucket_members`] and
    /// [`Backend::draw`] run where the logits are, so that sampling should ask for them rather
    /// than copy the row (a GPU); false where the row is at hand anyway.
    fn summarizes_scores(&self) -> bool {
        false
    }

    /// A batch of `tokens.len()` rows; `positions` has one entry per token.
    fn batch(&self, tokens: &[u32], positions: &[u32]) -> Self::Batch;
    /// Overwrites the rows of `b` (same row count) in place, in the same
    /// storage: a recorded graph that reads `b` sees the new values. Reads
    /// of `b` queued by [`Backend::queue_tokens`] and not taken are dropped.
    fn set_batch(&self, b: &mut Self::Batch, tokens: &[u32], positions: &[u32]);
    /// Queues (recordably, without a host round trip): each row of `b`
    /// takes the [`argmax`] of the same row of `logits` as its token, and
    /// its position moves one on. A greedy decode step that ends with this
    /// leaves the batch of the next one where the backend reads it, so the
    /// host can queue that step before it knows the token.
    fn argmax_into_batch(&self, logits: &Self::Tensor, b: &mut Self::Batch);
    /// Queues a copy of `b`'s tokens to the host, behind the work queued so
    /// far; [`Backend::take_tokens`] returns the copies in the order they
    /// were queued. A backend may bound how many choices
    /// ([`Backend::argmax_into_batch`], a recorded one at each replay) can
    /// be queued behind a copy before it is taken, and panic past it (the
    /// CUDA backend: 7); the greedy loop queues one.
    fn queue_tokens(&self, b: &mut Self::Batch);
    /// The oldest copy [`Backend::queue_tokens`] queued, once it is done.
    /// Panics if none is queued.
    fn take_tokens(&self, b: &mut Self::Batch) -> Vec<u32>;

    /// Starts recording: work queued from now on is captured instead of
    /// run, until [`Backend::end_graph`]. Returns false (and records
    /// nothing) where the backend cannot record. While recording, nothing
    /// may be read back to the host, and the launch geometry of every
    /// operation must not depend on values a [`Backend::set_batch`] changes
    /// (attention sizes itself for the KV capacity, not the positions).
    /// Work other threads queue on the same backend meanwhile would join
    /// the recording: a recording caller has the backend to itself (a
    /// scheduler records from the thread that runs the batch).
    fn begin_graph(&self) -> bool;
    /// Ends the recording; `None` if it failed (the work was not run
    /// either: run it again without recording).
    fn end_graph(&self) -> Option<Self::Graph>;
    /// Runs the recorded work again, on the current contents of the
    /// buffers it was recorded with.
    fn replay(&self, g: &Self::Graph);

    /// `out[i] = table[tokens[i]]` for the batch's tokens.
    fn embed(&self, table: &Self::Weight, batch: &Self::Batch, out: &mut Self::Tensor);
    /// `out = x / rms(x) * w` per row of width `w.len()` (applied to every
    /// `w.len()`-wide group of a row, so it also serves per-head norms).
    fn rms_norm(&self, x: &Self::Tensor, w: &Self::Weight, eps: f32, out: &mut Self::Tensor);
    /// `out = x · Wᵀ (+ bias)`.
    fn linear(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        bias: Option<&Self::Weight>,
        out: &mut Self::Tensor,
    );
    /// `outs[i] = x · parts[i].0ᵀ (+ parts[i].1)` for several weights that
    /// read the same input (q, k and v; gate and up): one pass where the
    /// backend can.
    fn linears(
        &self,
        x: &Self::Tensor,
        parts: &[(&Self::Weight, Option<&Self::Weight>)],
        outs: &mut [&mut Self::Tensor],
    ) {
        assert_eq!(parts.len(), outs.len(), "linears: one output per weight");
        for (&(w, bias), out) in parts.iter().zip(outs.iter_mut()) {
            self.linear(x, w, bias, out);
        }
    }
    /// `x += y`.
    fn add(&self, x: &mut Self::Tensor, y: &Self::Tensor);
    /// `outs[i] = rms_norm(x) · parts[i].0ᵀ (+ parts[i].1)`, and the normed
    /// rows into `normed` when it is given: a block's input norm and the
    /// projections that read it ([`Backend::rms_norm`], then
    /// [`Backend::linears`]). Backends may fuse the norm into the
    /// projections (computed where they read their input).
    fn rms_norm_linears(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        eps: f32,
        parts: &[(&Self::Weight, Option<&Self::Weight>)],
        outs: &mut [&mut Self::Tensor],
        normed: Option<&mut Self::Tensor>,
    ) {
        let (rows, cols) = self.shape(x);
        let mut own = None;
        let normed = match normed {
            Some(t) => t,
            None => own.insert(self.empty(rows, cols)),
        };
        self.rms_norm(x, w, eps, normed);
        self.linears(normed, parts, outs);
    }
    /// `acc += x · Wᵀ (+ bias)`: an output projection added into the
    /// residual stream ([`Backend::linear`], then [`Backend::add`]; one
    /// pass where the backend can).
    fn linear_add(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        bias: Option<&Self::Weight>,
        acc: &mut Self::Tensor,
    ) {
        let (rows, cols) = self.shape(acc);
        let mut y = self.empty(rows, cols);
        self.linear(x, w, bias, &mut y);
        self.add(acc, &y);
    }
    /// `out = act(gate) * up`.
    fn glu(&self, gate: &Self::Tensor, up: &Self::Tensor, act: Activation, out: &mut Self::Tensor);
    /// `out = act(rms_norm(x) · Gᵀ (+ bg)) * (rms_norm(x) · Uᵀ (+ bu))`
    /// for `gate` = (G, bg) and `up` = (U, bu): a gated MLP's input norm,
    /// gate and up projections and activation
    /// ([`Backend::rms_norm_linears`], then [`Backend::glu`]). Backends may
    /// fuse them (the activation written where the projections are
    /// summed), with the same results.
    #[allow(clippy::too_many_arguments)]
    fn rms_norm_glu(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        eps: f32,
        gate: (&Self::Weight, Option<&Self::Weight>),
        up: (&Self::Weight, Option<&Self::Weight>),
        act: Activation,
        out: &mut Self::Tensor,
    ) {
        let (rows, width) = self.shape(out);
        let mut g = self.empty(rows, width);
        let mut u = self.empty(rows, width);
        self.rms_norm_linears(x, w, eps, &[gate, up], &mut [&mut g, &mut u], None);
        self.glu(&g, &u, act, out);
    }
    /// `x *= s`.
    fn scale(&self, x: &mut Self::Tensor, s: f32);
    /// `x = cap · tanh(x / cap)`.
    fn softcap(&self, x: &mut Self::Tensor, cap: f32);
    /// Rotates each `head_dim`-wide head of each row by its position in
    /// the batch. Pairs are (i, i + head_dim/2) (the "rotate half"
    /// convention of transformers).
    fn rope(&self, x: &mut Self::Tensor, head_dim: usize, batch: &Self::Batch, rope: &RopeTable);

    /// The KV store dtype this backend picks by default ([`KvSpec::dtype`];
    /// a session may ask for another) for a model saved in `model` (its
    /// config's dtype). f32 unless a backend says otherwise.
    fn kv_dtype(&self, model: DType) -> KvDtype {
        let _ = model;
        KvDtype::F32
    }
    /// A KV store of `spec`; fails with [`BackendError::OutOfMemory`] where
    /// the device cannot hold it.
    fn kv_alloc(&self, spec: KvSpec) -> Result<Self::Kv>;
    /// Stores rows of `k` and `v` at slots `position % capacity`.
    fn kv_write(&self, kv: &mut Self::Kv, k: &Self::Tensor, v: &Self::Tensor, batch: &Self::Batch);
    /// What attention does after its projections: [`Backend::rope`] on `q`
    /// and on `k`, then [`Backend::kv_write`] of the rotated `k` and `v`
    /// (never rotated). `k` stays rotated for any caller that reads it.
    /// Backends may fuse the three into one pass (one kernel launch where
    /// the default takes three), with the same results.
    #[allow(clippy::too_many_arguments)]
    fn rope_kv_write(
        &self,
        q: &mut Self::Tensor,
        k: &mut Self::Tensor,
        v: &Self::Tensor,
        kv: &mut Self::Kv,
        head_dim: usize,
        batch: &Self::Batch,
        rope: &RopeTable,
    ) {
        self.rope(q, head_dim, batch, rope);
        self.rope(k, head_dim, batch, rope);
        self.kv_write(kv, k, v, batch);
    }
    /// Causal attention of each query row (at its batch position) over the keys
    /// held in `kv`, honouring the span; `out` is `[rows, num_heads * head_dim]`.
    /// `sinks` (one logit per query head) join each softmax denominator only.
    fn attention(
        &self,
        q: &Self::Tensor,
        kv: &Self::Kv,
        batch: &Self::Batch,
        params: &AttnParams,
        sinks: Option<&Self::Weight>,
        out: &mut Self::Tensor,
    );
    /// A block's attention after its projections:
    /// [`Backend::rope_kv_write`], then [`Backend::attention`] of the
    /// rotated `q`. Backends may fuse them (a decode step's RoPE, store
    /// write and attention in one pass), with the same results; `q` and `k`
    /// are then left rotated or not, so callers must not read them after.
    #[allow(clippy::too_many_arguments)]
    fn rope_kv_attention(
        &self,
        (q, k, v): (&mut Self::Tensor, &mut Self::Tensor, &Self::Tensor),
        kv: &mut Self::Kv,
        batch: &Self::Batch,
        rope: &RopeTable,
        params: &AttnParams,
        sinks: Option<&Self::Weight>,
        out: &mut Self::Tensor,
    ) {
        self.rope_kv_write(q, k, v, kv, params.head_dim, batch, rope);
        self.attention(q, kv, batch, params, sinks, out);
    }

    /// The expert half of an MoE block: route each row of `x` by its row of
    /// `router_logits` (`[rows, experts]`), run the selected experts and add
    /// their weighted sum to `out` (`[rows, hidden]`: the residual stream,
    /// or zeros for the sum alone). Each row's selected experts are summed
    /// from zero in ascending expert index, as transformers does, and the
    /// sum is then added to `out`.
    fn moe(
        &self,
        x: &Self::Tensor,
        router_logits: &Self::Tensor,
        experts: &Experts<'_, Self::Weight>,
        params: &MoeParams,
        out: &mut Self::Tensor,
    );

    /// A whole MoE block on the residual stream: `x += moe(rms_norm(x))`,
    /// each row routed by `rms_norm(x) · Rᵀ (+ rb)` ([`rms_norm_moe_parts`]).
    /// One operation, which a backend may fuse.
    fn rms_norm_moe(
        &self,
        x: &mut Self::Tensor,
        norm: &Self::Weight,
        eps: f32,
        router: (&Self::Weight, Option<&Self::Weight>),
        experts: &Experts<'_, Self::Weight>,
        params: &MoeParams,
    ) {
        rms_norm_moe_parts(self, x, norm, eps, router, experts, params);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_memory_says_how_much_what_is_free_and_what_to_change() {
        let e = BackendError::OutOfMemory {
            device: "GPU",
            what: "tensor `lm_head.weight`".into(),
            need: 1_050_673_152,
            free: Some((512 << 20, 80 << 30)),
            hint: WEIGHTS_HINT,
        };
        assert_eq!(
            e.to_string(),
            "out of GPU memory: tensor `lm_head.weight` needs 1002.0 MiB more, 512.0 MiB free of \
             80.00 GiB; load fewer bytes (--quant int8 or int4, a smaller model) or run on another \
             device (--device cpu)"
        );
        let e = BackendError::OutOfMemory {
            device: "host",
            what: "a layer's KV cache".into(),
            need: 3 << 30,
            free: None,
            hint: KV_F32_HINT,
        };
        assert!(
            e.to_string().starts_with(
                "out of host memory: a layer's KV cache needs 3.00 GiB more, the allocation failed; lower --context"
            ),
            "{e}"
        );
        let e = BackendError::OutOfMemory {
            device: "GPU",
            what: "a copy of 8192 elements".into(),
            need: 8192,
            free: Some((0, 1 << 30)),
            hint: "",
        };
        assert!(
            e.to_string()
                .contains("needs 8.0 KiB more, 0 bytes free of 1.00 GiB"),
            "{e}"
        );
        let e = BackendError::OutOfMemory {
            device: "GPU",
            what: "the buffers of a recorded decode step".into(),
            need: 0,
            free: Some((0, 1 << 30)),
            hint: "",
        };
        assert!(
            e.to_string().starts_with(
                "out of GPU memory: the buffers of a recorded decode step, 0 bytes free"
            ),
            "{e}"
        );
    }
}
