//! One sequence being generated: the model, its KV cache, and the prefill
//! and decode steps. Prefill feeds the prompt in chunks of at most
//! `max_chunk` tokens (all tokens of a chunk in one batched pass); decode
//! feeds one token at a time. It owns no sampling policy and no text.
//!
//! Decode steps are recorded once as a graph where the backend can (CUDA)
//! and replayed: every step runs the same work on a batch that is
//! overwritten in place, against the same KV storage, into the same logits
//! buffer, so one recording serves the whole sequence (it is dropped when
//! the storage is replaced by `reset`).

use turbospark_backend::scores::Keep;
use turbospark_backend::{Backend, KvDtype, ScoreStats, host_row};

use crate::error::{ModelError, Result};
use crate::families::CausalLm;
use crate::kv_cache::KvCache;
use crate::sampler::{Sampler, Scores};

pub struct Session<'m, B: Backend> {
    be: &'m B,
    model: &'m dyn CausalLm<B>,
    cache: KvCache<B>,
    /// Every token fed so far, in order (for prompt-prefix reuse).
    fed: Vec<u32>,
    decode: Decode<B>,
}

/// How decode steps run.
enum Decode<B: Backend> {
    /// Not recorded yet (the first decode step records).
    Unrecorded,
    Recorded(DecodeGraph<B>),
    /// Step by step: graphs are off, or the backend cannot record.
    Eager,
}

/// A recorded decode step and the buffers it was recorded with.
struct DecodeGraph<B: Backend> {
    graph: B::Graph,
    /// The step's token and position, overwritten before each replay.
    batch: B::Batch,
    /// `[1, vocab]`, written by each replay; `None` for a greedy step,
    /// which ends by choosing its token into `batch` (see
    /// [`Session::decode_greedy`]) and keeps no logits.
    logits: Option<B::Tensor>,
}

/// Why [`Session::decode_greedy`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GreedyEnd {
    /// `keep` refused a token (which was not fed).
    Refused,
    /// All the steps asked for were fed.
    Steps,
    /// `keep` took a token the cache had no room left for.
    ContextFull,
}

impl<'m, B: Backend> Session<'m, B> {
    /// A session whose KV cache takes the backend's default dtype for the
    /// model (`Backend::kv_dtype`).
    pub fn new(
        be: &'m B,
        model: &'m dyn CausalLm<B>,
        max_context: usize,
        max_chunk: usize,
    ) -> Result<Self> {
        let kv = be.kv_dtype(model.spec().dtype);
        Self::with_kv_dtype(be, model, max_context, max_chunk, kv)
    }

    /// A session whose KV cache keeps keys and values in `kv`.
    pub fn with_kv_dtype(
        be: &'m B,
        model: &'m dyn CausalLm<B>,
        max_context: usize,
        max_chunk: usize,
        kv: KvDtype,
    ) -> Result<Self> {
        let cache = KvCache::new(be, model.spec(), max_context, max_chunk, kv)?;
        Ok(Session {
            be,
            model,
            cache,
            fed: Vec::new(),
            decode: Decode::Unrecorded,
        })
    }

    /// Whether decode steps replay a recording (after the first decode
    /// step, on a backend that records).
    pub fn decode_recorded(&self) -> bool {
        self.recorded_step().is_some()
    }

    /// The recorded decode step, if there is one (to inspect the backend's
    /// graph: `turbospark_cuda::Recording::nodes`).
    pub fn recorded_step(&self) -> Option<&B::Graph> {
        match &self.decode {
            Decode::Recorded(g) => Some(&g.graph),
            _ => None,
        }
    }

    /// Runs every decode step as queued work instead of replaying a
    /// recording (`--eager`; for debugging and comparison).
    pub fn set_eager(&mut self, eager: bool) {
        self.decode = if eager {
            Decode::Eager
        } else {
            Decode::Unrecorded
        };
    }

    pub fn position(&self) -> usize {
        self.cache.len()
    }

    pub fn max_context(&self) -> usize {
        self.cache.max_context()
    }

    /// Forgets the sequence: an empty cache on fresh storage. Fails only
    /// where the device can no longer hold the cache it held before.
    pub fn reset(&mut self) -> Result<()> {
        // The recording points at the old KV storage.
        if let Decode::Recorded(_) = self.decode {
            self.decode = Decode::Unrecorded;
        }
        self.fed.clear();
        self.cache.clear(self.be, self.model.spec())
    }

    /// The tokens fed so far.
    pub fn tokens(&self) -> &[u32] {
        &self.fed
    }

    /// Keeps the longest prefix of the fed tokens that `prompt` starts with
    /// and returns the part of `prompt` still to feed. Reuses the cache
    /// across chat turns; at least one token is always left to feed so that
    /// there are logits to sample from.
    pub fn reuse_prefix<'p>(&mut self, prompt: &'p [u32]) -> &'p [u32] {
        let common = self
            .fed
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count()
            .min(prompt.len().saturating_sub(1));
        self.cache.truncate(common);
        self.fed.truncate(common);
        &prompt[common..]
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        let vocab = self.model.spec().vocab_size;
        match tokens.iter().find(|&&t| t as usize >= vocab) {
            Some(&id) => Err(ModelError::TokenOutOfRange { id, vocab }),
            None => Ok(()),
        }
    }

    /// Appends `tokens`; returns the logits of the last one, or of every one
    /// (`[tokens.len(), vocab]`, row-major) when `all_logits`.
    pub fn feed(&mut self, tokens: &[u32], all_logits: bool) -> Result<Vec<f32>> {
        if !all_logits {
            return self.feed_last(tokens, |be, l| be.to_host(l));
        }
        self.check_feed(tokens)?;
        let mut out = Vec::new();
        for chunk in tokens.chunks(self.cache.max_chunk()) {
            let logits = self.model.forward(self.be, chunk, &mut self.cache, true)?;
            self.fed.extend_from_slice(chunk);
            out.extend(self.be.to_host(&logits));
        }
        Ok(out)
    }

    /// Appends `tokens` and returns the most likely next token (the
    /// [`argmax`](turbospark_backend::argmax) of the last logits, chosen on
    /// the backend: nothing but the id comes back from a GPU).
    pub fn feed_argmax(&mut self, tokens: &[u32]) -> Result<u32> {
        self.feed_last(tokens, |be, l| be.argmax(l)[0])
    }

    /// Appends `tokens` and samples the next token from the last logits
    /// with `sampler` (`history`: the ids its penalties see). Where the
    /// backend summarizes logits where they are (a GPU), through
    /// [`Sampler::sample_from`]: a few numbers come back instead of the row.
    pub fn feed_sample(
        &mut self,
        tokens: &[u32],
        sampler: &mut Sampler,
        history: &[u32],
    ) -> Result<u32> {
        self.feed_last(tokens, |be, logits| {
            if be.summarizes_scores() {
                sampler.sample_from(&BackendRow { be, logits, row: 0 }, history)
            } else {
                sampler.sample(&be.to_host(logits), history)
            }
        })
    }

    fn check_feed(&self, tokens: &[u32]) -> Result<()> {
        if tokens.is_empty() {
            return Err(ModelError::EmptyPrompt);
        }
        self.check_tokens(tokens)?;
        // Fail before any work if the whole prompt cannot fit.
        if self.cache.len() + tokens.len() > self.cache.max_context() {
            return Err(ModelError::ContextFull {
                needed: self.cache.len() + tokens.len(),
                capacity: self.cache.max_context(),
            });
        }
        Ok(())
    }

    /// Appends `tokens` and reads the last token's logits `[1, vocab]` with
    /// `read`.
    fn feed_last<R>(
        &mut self,
        tokens: &[u32],
        read: impl FnOnce(&B, &B::Tensor) -> R,
    ) -> Result<R> {
        self.check_feed(tokens)?;
        if let [token] = tokens {
            return self.decode_step(*token, read);
        }
        // Whole chunks first; the last (possibly short) chunk gives the logits.
        let chunk = self.cache.max_chunk();
        let (head, last) = tokens.split_at((tokens.len() - 1) / chunk * chunk);
        for c in head.chunks(chunk) {
            self.model.forward(self.be, c, &mut self.cache, false)?;
            self.fed.extend_from_slice(c);
        }
        let logits = self.model.forward(self.be, last, &mut self.cache, false)?;
        self.fed.extend_from_slice(last);
        Ok(read(self.be, &logits))
    }

    /// Greedy decoding with the host one step ahead of the backend. Feeds
    /// `first`, then the greedy choice after each fed token, until `steps`
    /// tokens are fed in all, `keep` refuses a choice, or the cache is
    /// full. `keep` sees every choice in order, the one after the last
    /// fed token included. The tokens, the cache and [`Session::tokens`]
    /// end as a loop of [`Session::feed_argmax`] would leave them.
    ///
    /// Each step chooses its token into the batch the next step reads
    /// ([`Backend::argmax_into_batch`]), so step n + 1 is queued before the
    /// host has read token n: a GPU never waits for the host between
    /// steps. Where `keep` refuses a token, the step already queued for it
    /// is taken back (the cache rewinds one position).
    pub fn decode_greedy(
        &mut self,
        first: u32,
        steps: usize,
        mut keep: impl FnMut(u32) -> bool,
    ) -> Result<GreedyEnd> {
        if steps == 0 {
            return Ok(GreedyEnd::Steps);
        }
        self.check_feed(&[first])?;
        let positions = self.cache.reserve(1)?;
        self.prepare_recording(first, &positions, true)?;
        let Session {
            be,
            model,
            cache,
            fed,
            decode,
        } = self;
        let be = *be;
        let mut own;
        let (graph, batch) = match decode {
            Decode::Recorded(g) => {
                be.set_batch(&mut g.batch, &[first], &positions);
                (Some(&g.graph), &mut g.batch)
            }
            _ => {
                own = be.batch(&[first], &positions);
                (None, &mut own)
            }
        };
        // Queues one step on the batch's token and position, its choice
        // written back into the batch and queued for the host.
        let step = |batch: &mut B::Batch, cache: &mut KvCache<B>| -> Result<()> {
            match graph {
                Some(g) => {
                    be.replay(g);
                    cache.advance(1);
                }
                None => {
                    let logits = model.forward_batch(be, batch, 1, cache, false)?;
                    be.argmax_into_batch(&logits, batch);
                }
            }
            be.queue_tokens(batch);
            Ok(())
        };
        step(batch, cache)?;
        fed.push(first);
        let mut fed_n = 1;
        loop {
            // The step that feeds the choice about to be read, queued first
            // where it may be wanted.
            let ahead = fed_n < steps && cache.len() < cache.max_context();
            if ahead {
                step(batch, cache)?;
            }
            let token = be.take_tokens(batch)[0];
            if !keep(token) {
                if ahead {
                    be.take_tokens(batch);
                    cache.truncate(cache.len() - 1);
                }
                return Ok(GreedyEnd::Refused);
            }
            if fed_n == steps {
                return Ok(GreedyEnd::Steps);
            }
            if !ahead {
                return Ok(GreedyEnd::ContextFull);
            }
            fed.push(token);
            fed_n += 1;
        }
    }

    /// Leaves `self.decode` recorded for steps that do (`greedy`) or do
    /// not choose their token into the batch, recording again if the
    /// recording is of the other kind; eager where the backend cannot
    /// record.
    fn prepare_recording(&mut self, token: u32, positions: &[u32], greedy: bool) -> Result<()> {
        let stale = match &self.decode {
            Decode::Unrecorded => true,
            Decode::Recorded(g) => g.logits.is_none() != greedy,
            Decode::Eager => false,
        };
        if stale {
            // The old recording's buffers go before the new one's are made.
            self.decode = Decode::Unrecorded;
            self.decode = match self.record(token, positions, greedy)? {
                Some(g) => Decode::Recorded(g),
                None => Decode::Eager,
            };
        }
        Ok(())
    }

    /// One token: replays the recorded step (recording it on first use),
    /// or runs it eagerly where there is no recording.
    fn decode_step<R>(&mut self, token: u32, read: impl FnOnce(&B, &B::Tensor) -> R) -> Result<R> {
        let positions = self.cache.reserve(1)?;
        let be = self.be;
        self.prepare_recording(token, &positions, false)?;
        let out = match &mut self.decode {
            // prepare_recording(.., false) left a step that keeps its logits.
            Decode::Recorded(DecodeGraph {
                graph,
                batch,
                logits: Some(logits),
            }) => {
                be.set_batch(batch, &[token], &positions);
                be.replay(graph);
                self.cache.advance(1);
                read(be, logits)
            }
            _ => {
                let l = self.model.forward(be, &[token], &mut self.cache, false)?;
                read(be, &l)
            }
        };
        self.fed.push(token);
        Ok(out)
    }

    /// Records one decode step without running it (ending with its greedy
    /// choice written into its batch if `greedy`). `None` where the
    /// backend cannot record (or the recording failed); the cache is left
    /// as it was either way.
    fn record(
        &mut self,
        token: u32,
        positions: &[u32],
        greedy: bool,
    ) -> Result<Option<DecodeGraph<B>>> {
        let be = self.be;
        // Everything that outlives the recording is made before it starts.
        let mut batch = be.batch(&[token], positions);
        let mut logits = (!greedy).then(|| be.tensor(1, self.model.spec().vocab_size));
        if !be.begin_graph() {
            return Ok(None);
        }
        let len = self.cache.len();
        let out = self
            .model
            .forward_batch(be, &batch, 1, &mut self.cache, false);
        if let Ok(l) = &out {
            match &mut logits {
                Some(kept) => be.copy(l, kept),
                None => be.argmax_into_batch(l, &mut batch),
            }
        }
        // The forward's own logits are freed inside the recording.
        let out = out.map(drop);
        let graph = be.end_graph();
        // Nothing ran: the replay fills these positions.
        self.cache.truncate(len);
        out?;
        Ok(graph.map(|graph| DecodeGraph {
            graph,
            batch,
            logits,
        }))
    }
}

/// Row `row` of logits held by a backend, as the sampler asks for it (a
/// step leaves one, `[1, vocab]`).
pub struct BackendRow<'a, B: Backend> {
    pub be: &'a B,
    pub logits: &'a B::Tensor,
    pub row: usize,
}

impl<B: Backend> Scores for BackendRow<'_, B> {
    fn stats(&self, t: f32) -> ScoreStats {
        self.be.score_stats(self.logits, self.row, t)
    }
    fn above(&self, t: f32, floor: f32, cap: usize) -> Option<Vec<(u32, f32)>> {
        self.be.scores_above(self.logits, self.row, t, floor, cap)
    }
    fn buckets(&self, t: f32, max: f32, keep: &Keep, rounded: bool) -> Vec<f64> {
        self.be
            .score_buckets(self.logits, self.row, t, max, keep, rounded)
    }
    fn members(
        &self,
        t: f32,
        max: f32,
        keep: &Keep,
        bucket: usize,
        cap: usize,
    ) -> Option<Vec<(u32, f32)>> {
        self.be
            .bucket_members(self.logits, self.row, t, max, keep, bucket, cap)
    }
    fn draw(&self, t: f32, min_w: f64, u: f64) -> Option<u32> {
        self.be.draw(self.logits, self.row, t, min_w, u)
    }
    fn row(&self) -> Vec<f32> {
        host_row(self.be, self.logits, self.row)
    }
}
