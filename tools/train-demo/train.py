#!/usr/bin/env python3
"""Train TurboSpark's demo model: a small gpt-oss-architecture LM (GptOssForCausalLM:
MoE with clamped-SwiGLU experts, attention sinks, alternating sliding/full attention,
YaRN RoPE) with its own byte-level BPE tokenizer, on the Rust books' text
(tools/train-demo/corpus, made by prepare_corpus.py), written in the released
gpt-oss layout (experts in MXFP4, the rest bf16).

    python3 tools/train-demo/train.py --out OUT_DIR                  # GPU run (~6-7 min)
    python3 tools/train-demo/train.py --out /tmp/x --device cpu --max-steps 5 \
        --batch-size 2 --seq-len 128                                 # CPU smoke test

Reads only --corpus (default: the corpus/ folder next to this script) and
writes only into --out. See README.md next to this script for the recipe.
"""

import os

# Must be set before CUDA is initialised (deterministic cuBLAS).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

import argparse  # noqa: E402
import copy  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402

T_START = time.time()

import numpy as np  # noqa: E402
import safetensors  # noqa: E402
import safetensors.torch  # noqa: E402
import tokenizers  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402
from transformers import GptOssConfig, GptOssForCausalLM  # noqa: E402
from transformers.integrations.mxfp4 import convert_moe_packed_tensors  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DOC_SEP = "\n<|endoftext|>\n"

# o200k's pre-tokenisation regex, as in gpt-oss' own tokenizer.json.
O200K_PATTERN = "|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])

# The special tokens occupy the last N_SPECIAL ids, at the same offsets from the first
# special id as in gpt-oss' o200k_harmony (199998 + offset); the other slots are
# <|reserved_ID|>.
N_SPECIAL = 32
SPECIAL_OFFSETS = {
    "<|startoftext|>": 0,   # 199998
    "<|endoftext|>": 1,     # 199999
    "<|return|>": 4,        # 200002
    "<|constrain|>": 5,     # 200003
    "<|channel|>": 7,       # 200005
    "<|start|>": 8,         # 200006
    "<|end|>": 9,           # 200007
    "<|message|>": 10,      # 200008
    "<|call|>": 14,         # 200012
    "<|endofprompt|>": 20,  # 200018
}

NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]

# E2M1 magnitudes and the rounding boundaries between them (ties go to the smaller).
FP4_POS = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
FP4_BOUNDS = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]


def log(*a):
    print(f"[{time.time() - T_START:7.1f}s]", *a, flush=True)


# ---------------------------------------------------------------------------
# MXFP4
# ---------------------------------------------------------------------------

def mxfp4_quantize(w: torch.Tensor):
    """Quantize ``w [..., rows, cols]`` (cols % 32 == 0) in 32-wide blocks along cols.

    Returns (codes uint8 [..., rows, cols/32, 32], exps int32 [..., rows, cols/32],
    dequantized float32 [..., rows, cols]). Per block the shared exponent is either
    e = the smallest with max|x| / 2^e <= 6 or e - 1 (the largest values then clip
    to 6), whichever gives the smaller squared error; each value is rounded to the
    nearest E2M1 value (ties to the smaller magnitude), sign in bit 3.
    """
    x = w.detach().float()
    *pre, rows, cols = x.shape
    assert cols % 32 == 0, x.shape
    x = x.reshape(*pre, rows, cols // 32, 32)
    amax = x.abs().amax(-1)
    pos = torch.tensor(FP4_POS, device=x.device)
    bounds = torch.tensor(FP4_BOUNDS, device=x.device)
    safe = torch.where(amax > 0, amax, torch.ones_like(amax))
    e = torch.ceil(torch.log2(safe / 6.0)).to(torch.int32)
    # exact fix-ups against log2 rounding
    e = torch.where(safe / torch.exp2(e.float()) > 6.0, e + 1, e)
    e = torch.where(safe / torch.exp2((e - 1).float()) <= 6.0, e - 1, e)
    e = torch.where(amax > 0, e, torch.full_like(e, -127)).clamp(-127, 127)

    def encode(exp):
        y = x / torch.exp2(exp.float())[..., None]
        mag = torch.bucketize(y.abs().contiguous(), bounds, right=False)  # 0..7, > 5 -> 7 (clips to 6)
        codes = mag | torch.where(torch.signbit(y), 8, 0)
        deq = torch.where(torch.signbit(y), -pos[mag], pos[mag]) * torch.exp2(exp.float())[..., None]
        return codes.to(torch.uint8), deq

    c_hi, d_hi = encode(e)
    e_lo = (e - 1).clamp(min=-127)
    c_lo, d_lo = encode(e_lo)
    err_hi = (d_hi - x).pow(2).sum(-1)
    err_lo = (d_lo - x).pow(2).sum(-1)
    use_lo = (err_lo < err_hi) & (e > -127)
    codes = torch.where(use_lo[..., None], c_lo, c_hi)
    exps = torch.where(use_lo, e_lo, e)
    deq = torch.where(use_lo[..., None], d_lo, d_hi)
    return codes, exps, deq.reshape(*pre, rows, cols)


def mxfp4_pack(w_xw: torch.Tensor):
    """Expert parameter in transformers' x @ W layout [E, in, out] -> released
    (blocks uint8 [E, out, in/32, 16], scales uint8 [E, out, in/32])."""
    codes, exps, _ = mxfp4_quantize(w_xw.transpose(1, 2))
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)  # low nibble = even element
    scales = (exps + 127).to(torch.uint8)
    return blocks.contiguous(), scales.contiguous()


def mxfp4_fake_quant_xw(w_xw: torch.Tensor) -> torch.Tensor:
    """Value of the expert weight after an MXFP4 round trip, with a straight-through
    gradient (used for quantization-aware training and for evaluating in MXFP4)."""
    _, _, deq = mxfp4_quantize(w_xw.transpose(1, 2))
    deq = deq.transpose(1, 2).to(w_xw.dtype)
    return w_xw + (deq - w_xw).detach()


# ---------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------

def special_tokens(vocab_size):
    first = vocab_size - N_SPECIAL
    names = {off: name for name, off in SPECIAL_OFFSETS.items()}
    return [(first + i, names.get(i, f"<|reserved_{first + i}|>")) for i in range(N_SPECIAL)]


def train_tokenizer(train_docs, vocab_size):
    n_bpe = vocab_size - N_SPECIAL
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(O200K_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=n_bpe, min_frequency=2, show_progress=False, special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(train_docs, trainer=trainer)
    got = tok.get_vocab_size()
    if got != n_bpe:
        raise SystemExit(f"BPE training gave {got} tokens, wanted {n_bpe} (corpus too small?)")
    specials = special_tokens(vocab_size)
    tok.add_special_tokens([AddedToken(name, special=True, normalized=False) for _, name in specials])
    for tid, name in specials:
        assert tok.token_to_id(name) == tid, (name, tok.token_to_id(name), tid)
    assert tok.get_vocab_size() == vocab_size
    return tok


def tokenizer_config(tok, chat_template, max_len):
    added = {}
    for tid, name in special_tokens(tok.get_vocab_size()):
        added[str(tid)] = {"content": name, "lstrip": False, "normalized": False, "rstrip": False,
                           "single_word": False, "special": True}
    return {
        "added_tokens_decoder": added,
        "bos_token": "<|startoftext|>",
        "chat_template": chat_template,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|return|>",
        "extra_special_tokens": {},
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": max_len,
        "pad_token": "<|endoftext|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


# ---------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------

def build_config(a, vocab_size, ids):
    n = a.layers
    return GptOssConfig(
        vocab_size=vocab_size, hidden_size=a.hidden, intermediate_size=a.intermediate,
        num_hidden_layers=n, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
        head_dim=a.head_dim, num_local_experts=a.experts, num_experts_per_tok=a.top_k,
        sliding_window=a.sliding_window,
        layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)],
        max_position_embeddings=a.max_position_embeddings,
        rope_parameters={"rope_type": "yarn", "rope_theta": a.rope_theta, "factor": a.yarn_factor,
                         "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                         "original_max_position_embeddings": a.original_context},
        attention_bias=True, attention_dropout=0.0, rms_norm_eps=1e-5,  # swiglu_limit: 7.0 (default)
        tie_word_embeddings=False, initializer_range=0.02, router_aux_loss_coef=a.aux_coef,
        output_router_logits=False, use_cache=True,
        bos_token_id=ids["<|startoftext|>"], eos_token_id=ids["<|return|>"],
        pad_token_id=ids["<|endoftext|>"],
    )


def new_model(config):
    return GptOssForCausalLM._from_config(config, attn_implementation="eager",
                                          experts_implementation="eager")


def config_json_4x(config, args):
    """config.json in the released (transformers 4.x) spelling."""
    rp = dict(config.rope_parameters)
    theta = rp.pop("rope_theta")
    return dict(sorted({
        "architectures": ["GptOssForCausalLM"],
        "attention_bias": True,
        "attention_dropout": 0.0,
        "eos_token_id": config.eos_token_id,
        "experts_per_token": config.num_experts_per_tok,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "hidden_size": config.hidden_size,
        "initial_context_length": rp["original_max_position_embeddings"],
        "initializer_range": config.initializer_range,
        "intermediate_size": config.intermediate_size,
        "layer_types": list(config.layer_types),
        "max_position_embeddings": config.max_position_embeddings,
        "model_type": "gpt_oss",
        "num_attention_heads": config.num_attention_heads,
        "num_experts_per_tok": config.num_experts_per_tok,
        "num_hidden_layers": config.num_hidden_layers,
        "num_key_value_heads": config.num_key_value_heads,
        "num_local_experts": config.num_local_experts,
        "output_router_logits": False,
        "pad_token_id": config.pad_token_id,
        "quantization_config": {"modules_to_not_convert": NOT_CONVERTED, "quant_method": "mxfp4"},
        "rms_norm_eps": config.rms_norm_eps,
        "rope_scaling": dict(sorted(rp.items())),
        "rope_theta": theta,
        "router_aux_loss_coef": config.router_aux_loss_coef,
        "sliding_window": config.sliding_window,
        "swiglu_limit": 7.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": transformers.__version__,
        "use_cache": True,
        "vocab_size": config.vocab_size,
    }.items()))


def param_stats(config):
    """(total params, expert params, file bytes of the released layout)."""
    H, W, E, L, V = (config.hidden_size, config.intermediate_size, config.num_local_experts,
                     config.num_hidden_layers, config.vocab_size)
    q = config.num_attention_heads * config.head_dim
    kv = config.num_key_value_heads * config.head_dim
    attn = H * q + q + 2 * (H * kv + kv) + q * H + H + config.num_attention_heads
    router = E * H + E
    expert_w = 3 * E * H * W
    expert_b = E * 2 * W + E * H
    norms = 2 * H
    per_layer_bf16 = attn + router + expert_b + norms
    bf16 = 2 * V * H + H + L * per_layer_bf16
    mx_bytes = L * (expert_w // 2 + expert_w // 32)  # 4 bits/value + 1 scale byte/32 values
    total = bf16 + L * expert_w
    return {"params_total": total, "params_experts": L * expert_w, "params_bf16": bf16,
            "params_active_per_token": total - L * expert_w * (E - config.num_experts_per_tok) // E
            - V * H,  # embeddings are a lookup
            "file_bytes_estimate": 2 * bf16 + mx_bytes}


def patch_experts(model, dropout):
    """Training-time forward for the experts: same maths as GptOssExperts' eager loop
    (gate_up = x @ W + b; clamped SwiGLU; down; weighted sum of the top-k), but with one
    gather per layer, a deterministic reduction and optional MXFP4 fake quantisation."""

    def forward(self, hidden_states, router_indices=None, routing_weights=None):
        T, H = hidden_states.shape
        K = router_indices.shape[1]
        gu_w, d_w = self.gate_up_proj, self.down_proj
        if self.fake_quant:
            gu_w, d_w = mxfp4_fake_quant_xw(gu_w), mxfp4_fake_quant_xw(d_w)
        flat = router_indices.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        x = hidden_states.unsqueeze(1).expand(T, K, H).reshape(T * K, H)[order]
        outs, start = [], 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            xe = x[start:start + n]
            start += n
            gu = xe @ gu_w[e] + self.gate_up_proj_bias[e]
            outs.append(self._apply_gate(gu) @ d_w[e] + self.down_proj_bias[e])
        y = torch.cat(outs) * routing_weights.reshape(-1)[order].unsqueeze(-1)
        y = y.new_zeros(y.shape).index_copy(0, order, y)
        out = y.view(T, K, H).sum(1)
        if self.training and self.dropout_p > 0:
            out = F.dropout(out, self.dropout_p, True)
        return out.to(hidden_states.dtype)

    for layer in model.model.layers:
        ex = layer.mlp.experts
        ex.fake_quant = False
        ex.dropout_p = dropout
        ex.forward = types.MethodType(forward, ex)
        if dropout > 0:
            layer.self_attn.o_proj.register_forward_hook(
                lambda m, i, o: F.dropout(o, dropout, True) if m.training else o)


def set_fake_quant(model, on):
    for layer in model.model.layers:
        layer.mlp.experts.fake_quant = on


# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------

def read_docs(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    docs = [d.strip("\n") for d in text.split(DOC_SEP)]
    return [d for d in docs if d]


def encode_stream(tok, docs, eot):
    ids = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eot)
    return np.asarray(ids, dtype=np.int64)


class Batches:
    """Epochs over the training stream: each epoch starts at a random offset, cuts the
    stream into windows of seq_len + 1 and visits them in a random order."""

    def __init__(self, stream, seq_len, batch, seed):
        self.stream, self.seq, self.batch = stream, seq_len, batch
        self.rng = np.random.default_rng(seed)
        self.epoch, self.queue = 0, []
        self.windows_per_epoch = (len(stream) - 1) // (seq_len + 1) - 1
        if self.windows_per_epoch < batch:
            raise SystemExit(f"corpus too small: {len(stream)} tokens for batch {batch} x {seq_len}")

    def _refill(self):
        off = int(self.rng.integers(0, self.seq + 1))
        starts = off + (self.seq + 1) * np.arange(self.windows_per_epoch)
        self.queue.extend(self.rng.permutation(starts).tolist())
        self.epoch += 1

    def next(self):
        while len(self.queue) < self.batch:
            self._refill()
        take, self.queue = self.queue[:self.batch], self.queue[self.batch:]
        w = np.stack([self.stream[s:s + self.seq + 1] for s in take])
        return torch.from_numpy(w)


def eval_windows(stream, seq_len):
    """Consecutive windows covering the whole stream (the last one may be shorter)."""
    return [stream[i:i + seq_len + 1] for i in range(0, len(stream) - 1, seq_len)]


@torch.no_grad()
def evaluate(model, windows, batch, device, autocast):
    """Mean next-token cross entropy over the windows (every token but the first of
    each window is predicted, with the window as context)."""
    was = model.training
    model.eval()
    tot, cnt = 0.0, 0
    groups = [windows[i:i + batch] for i in range(0, len(windows), batch)]
    groups = [g2 for g in groups for g2 in ([g] if len({len(x) for x in g}) == 1
                                             else [[x] for x in g])]
    for g in groups:
        w = torch.from_numpy(np.stack(g)).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=w[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1),
                               reduction="sum")
        tot += loss.item()
        cnt += w[:, 1:].numel()
    model.train(was)
    return tot / cnt


# ---------------------------------------------------------------------------
# Export
# ---------------------------------------------------------------------------

def is_expert_weight(name):
    return name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj"))


def export_tensors(state):
    """Released layout: experts MXFP4 (blocks/scales), everything else bf16. Also
    returns the round trip through transformers' own MXFP4 decoder, checked against
    our quantiser bit for bit."""
    out, dequant = {}, {}
    for name, p in state.items():
        p = p.detach().float().cpu()
        if is_expert_weight(name):
            blocks, scales = mxfp4_pack(p)
            out[name + "_blocks"], out[name + "_scales"] = blocks, scales
            back = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
            ours = mxfp4_quantize(p.transpose(1, 2))[2].transpose(1, 2)
            if back.shape != p.shape or not torch.equal(back, ours.contiguous()):
                raise SystemExit(f"MXFP4 round trip mismatch for {name}: "
                                 f"{tuple(back.shape)} vs {tuple(p.shape)}, "
                                 f"max diff {(back - ours).abs().max().item() if back.shape == ours.shape else 'n/a'}")
            dequant[name] = back
        else:
            out[name] = p.to(torch.bfloat16).contiguous()
    return out, dequant


def model_from_weights(config, weights, device):
    """A float32 model holding exactly the given (bf16 or dequantized) weights, running
    transformers' own (eager) forward."""
    m = new_model(config)
    sd = {k: v.float() for k, v in weights.items()}
    missing, unexpected = m.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not k.endswith("rotary_emb.inv_freq")]
    if missing or unexpected:
        raise SystemExit(f"state dict mismatch: missing {missing} unexpected {unexpected}")
    return m.to(device).eval()


@torch.no_grad()
def greedy_samples(model, tok, prompts, device, n_new, eot_ids):
    res = []
    for p in prompts:
        ids = torch.tensor([tok.encode(p, add_special_tokens=False).ids], device=device)
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n_new,
                             do_sample=False, eos_token_id=eot_ids, pad_token_id=eot_ids[0])
        res.append({"prompt": p, "completion": tok.decode(out[0, ids.shape[1]:].tolist(),
                                                          skip_special_tokens=False)})
    return res


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def model_card(info):
    c, r, lg = info["config"], info["recipe"], info["log"]
    ppl_line = (f"| bf16 weights | {lg['valid_loss_bf16']:.4f} | {lg['valid_ppl_bf16']:.2f} |\n"
                f"| MXFP4 experts (as shipped) | {lg['valid_loss_mxfp4']:.4f} | {lg['valid_ppl_mxfp4']:.2f} |\n"
                f"| MXFP4, on a training sample of the same size | {lg['train_sample_loss_mxfp4']:.4f} "
                f"| {lg['train_sample_ppl_mxfp4']:.2f} |")
    fence = "`" * 4
    samples = "\n\n".join(f"{fence}text\n{s['prompt']}\u2588{s['completion']}\n{fence}"
                          for s in lg.get("samples", []))
    return f"""# turbospark-demo-gpt-oss

A small language model with the **gpt-oss architecture** (`GptOssForCausalLM`), trained
from scratch on the Rust documentation books, to ship with TurboSpark as a real
(not random) demo model. It writes
Rust-book-flavoured English and Rust code; it is **not** instruction-tuned, knows
nothing beyond those books and is often wrong. Use it to exercise an inference
engine, not for answers.

```sh
turbospark run --model MODEL_DIR --prompt "fn main() {{" --max-tokens 64
```

## Architecture

| | |
|---|---|
| layers | {c['num_hidden_layers']} (alternating sliding-window {c['sliding_window']} / full attention, sliding first) |
| hidden size | {c['hidden_size']} |
| attention | {c['num_attention_heads']} query heads, {c['num_key_value_heads']} KV heads, head_dim {c['head_dim']}, q/k/v/o biases, learned attention sinks |
| MoE | {c['num_local_experts']} experts, top-{c['num_experts_per_tok']}, expert width {c['intermediate_size']}, clamped SwiGLU (limit 7, α 1.702), expert biases |
| RoPE | YaRN, θ {c['rope_theta']}, factor {c['rope_scaling']['factor']}, original context {c['rope_scaling']['original_max_position_embeddings']}, max positions {c['max_position_embeddings']} |
| vocabulary | {c['vocab_size']} (byte-level BPE trained on the corpus + Harmony special tokens) |
| parameters | {info['params']['params_total']:,} total, {info['params']['params_experts']:,} in experts, ~{info['params']['params_active_per_token']:,} active per token (excluding the embedding lookup) |
| file | `model.safetensors`, {info['file_bytes']:,} bytes: experts in MXFP4 (`*_blocks`/`*_scales`, as released gpt-oss), everything else bf16 |

Untied embeddings; RMSNorm ε 1e-5. `config.json` uses the transformers 4.x spelling of the
released gpt-oss checkpoints (`rope_scaling`, `rope_theta`, `torch_dtype`,
`quantization_config: mxfp4`).

## Tokenizer

Byte-level BPE (Hugging Face `tokenizers`) with gpt-oss' o200k pre-tokenisation regex,
{c['vocab_size'] - N_SPECIAL} BPE tokens (256 byte tokens + merges) trained on the training split, then
{N_SPECIAL} special ids at the end: `<|startoftext|>`, `<|endoftext|>`, `<|return|>`,
`<|constrain|>`, `<|channel|>`, `<|start|>`, `<|end|>`, `<|message|>`, `<|call|>`,
`<|endofprompt|>` at the same offsets from the first special id as in o200k_harmony,
the rest `<|reserved_N|>`. Documents were separated by `<|endoftext|>` in training; the
Harmony tokens are in the vocabulary (and the real gpt-oss chat template ships in
`chat_template.jinja`) but the model never saw them in training.

## Data

{info['data_md']}

## Training

{r}

## Results

Validation: the held-out pages (every 20th page in reading order), {lg['valid_tokens']:,} tokens,
windows of {lg['seq_len']} tokens, evaluated with transformers' own forward pass in float32
on the weights as stored. The exported step was chosen on this same validation set (best of
the periodic evaluations), so these figures are slightly optimistic.

| weights | loss (nats/token) | perplexity |
|---|---|---|
{ppl_line}

Greedy samples (MXFP4 weights; the prompt ends at █):

{samples}

## Licence

The model weights and tokenizer are derived from the Rust documentation books, which are
dual-licensed MIT OR Apache-2.0; they are distributed under the same terms
(MIT OR Apache-2.0), like TurboSpark. The chat template is gpt-oss' (Apache-2.0).
"""


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output model directory (created)")
    ap.add_argument("--corpus", default=os.path.join(HERE, "corpus"),
                    help="folder with train.txt / valid.txt / SOURCES.md (prepare_corpus.py)")
    ap.add_argument("--chat-template", default=os.path.join(
        REPO, "crates", "turbospark-text", "testdata", "templates", "openai-gpt-oss-120b.jinja"))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=1234)
    # model
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=320)
    ap.add_argument("--intermediate", type=int, default=320, help="expert width")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--sliding-window", type=int, default=128)
    ap.add_argument("--rope-theta", type=float, default=150000.0)
    ap.add_argument("--yarn-factor", type=float, default=4.0)
    ap.add_argument("--original-context", type=int, default=512)
    ap.add_argument("--max-position-embeddings", type=int, default=2048)
    ap.add_argument("--max-file-mb", type=float, default=25.0, help="refuse configs whose file would exceed this (10^6 bytes)")
    # optimisation
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup-steps", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--dropout", type=float, default=0.2, help="on attention and expert outputs (training only)")
    ap.add_argument("--aux-coef", type=float, default=0.02, help="router load-balancing loss weight")
    ap.add_argument("--qat-frac", type=float, default=0.2,
                    help="last fraction of the steps trains through MXFP4 fake quantisation of the experts")
    ap.add_argument("--max-steps", type=int, default=None, help="fixed step count (overrides the time plan)")
    ap.add_argument("--max-epochs", type=float, default=12.0,
                    help="planned length in epochs (the cosine schedule spans it); 0: plan from --time-budget-s only")
    ap.add_argument("--time-budget-s", type=float, default=390.0,
                    help="training-loop seconds: after --calib-steps timed steps the plan is cut to fit this budget")
    ap.add_argument("--calib-steps", type=int, default=30)
    ap.add_argument("--eval-every", type=int, default=None, help="steps between validations (default: ~1/20 of the run)")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--keep-last", action="store_true", help="export the last step, not the best validation")
    ap.add_argument("--eval-batch", type=int, default=16)
    ap.add_argument("--eval-windows", type=int, default=None, help="cap on validation windows (smoke tests)")
    ap.add_argument("--save-float", action="store_true",
                    help="also write float32 weights (save_pretrained) to OUT/float-reference/ (debugging)")
    ap.add_argument("--no-samples", action="store_true")
    args = ap.parse_args()

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    if cuda:
        # CPU kernels are deterministic already (and the deterministic mode slows them down)
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = False
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    os.makedirs(args.out, exist_ok=True)

    # -- data and tokenizer ------------------------------------------------
    train_docs = read_docs(os.path.join(args.corpus, "train.txt"))
    valid_docs = read_docs(os.path.join(args.corpus, "valid.txt"))
    log(f"corpus: {len(train_docs)} train docs, {len(valid_docs)} valid docs")
    tok = train_tokenizer(train_docs, args.vocab_size)
    ids = {name: tid for tid, name in special_tokens(args.vocab_size)}
    eot = ids["<|endoftext|>"]
    train_stream = encode_stream(tok, train_docs, eot)
    valid_stream = encode_stream(tok, valid_docs, eot)
    train_bytes = sum(len(d.encode()) for d in train_docs)
    log(f"tokenizer: {tok.get_vocab_size()} ids; train {len(train_stream):,} tokens "
        f"({train_bytes / len(train_stream):.2f} bytes/token), valid {len(valid_stream):,} tokens")

    # -- model --------------------------------------------------------------
    config = build_config(args, args.vocab_size, ids)
    stats = param_stats(config)
    log(f"params: {stats['params_total']:,} total ({stats['params_experts']:,} experts), "
        f"file ~{stats['file_bytes_estimate'] / 1e6:.2f} MB")
    if stats["file_bytes_estimate"] > args.max_file_mb * 1e6:
        raise SystemExit(f"model file would be {stats['file_bytes_estimate'] / 1e6:.2f} MB > {args.max_file_mb} MB")
    torch.manual_seed(args.seed)
    model = new_model(config)
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params == stats["params_total"], (n_params, stats["params_total"])

    # The training forward must equal transformers' own (eager) forward.
    ref = copy.deepcopy(model).eval()
    patch_experts(model, args.dropout)
    model.eval()
    with torch.no_grad():
        probe = torch.from_numpy(train_stream[:2 * 64].reshape(2, 64).copy())
        a = ref(input_ids=probe).logits
        b = model(input_ids=probe).logits
        diff = (a - b).abs().max().item()
    log(f"patched-vs-transformers forward: max |dlogit| = {diff:.2e}")
    if diff > 1e-4:
        raise SystemExit("training forward differs from transformers' GptOssForCausalLM")
    del ref
    model.to(device).train()

    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (decay if p.dim() >= 2 else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=cuda)

    batches = Batches(train_stream, args.seq_len, args.batch_size, args.seed)
    steps_per_epoch = batches.windows_per_epoch / args.batch_size
    v_windows = eval_windows(valid_stream, args.seq_len)[: args.eval_windows]
    # a training sample of the same size as validation, for the generalisation gap
    t_windows = eval_windows(train_stream[: len(valid_stream)], args.seq_len)[: args.eval_windows]

    planned = args.max_steps
    if planned is None and args.max_epochs:
        planned = max(1, int(args.max_epochs * steps_per_epoch))
    time_planned = args.max_steps is None  # the time budget may shorten the plan
    eval_every = args.eval_every

    def lr_at(step, total):
        if step < args.warmup_steps:
            return args.lr * (step + 1) / args.warmup_steps
        prog = min(1.0, (step - args.warmup_steps) / max(1, total - args.warmup_steps))
        return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * prog)))

    curve, evals = [], []
    best = {"loss": float("inf"), "step": None, "state": None}
    tokens_seen = 0
    step = 0
    t_train = time.time()
    t_calib = None
    stopped_by_time = False
    time_cut = False
    total = planned if planned is not None else 10 ** 9
    qat_on = False
    log(f"training: {steps_per_epoch:.1f} steps/epoch of {args.batch_size}x{args.seq_len}; "
        f"{'planned ' + str(planned) + ' steps' if planned else 'steps planned from timing'}")

    def run_eval(step):
        set_fake_quant(model, True)  # select on the model as it will ship (MXFP4 experts)
        vl = evaluate(model, v_windows, args.eval_batch, device, cuda)
        set_fake_quant(model, qat_on)
        evals.append({"step": step, "valid_loss_mxfp4": round(vl, 5),
                      "epoch": round(step / steps_per_epoch, 2), "elapsed_s": round(time.time() - t_train, 1)})
        if vl < best["loss"]:
            best.update(loss=vl, step=step,
                        state={k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()})
        log(f"  eval step {step}: valid loss (MXFP4) {vl:.4f} ppl {math.exp(vl):.2f}"
            f"{'  *best*' if best['step'] == step else ''}")

    while step < total:
        if step == args.calib_steps + 5 and time_planned and total > step:
            # fit the plan into the time budget, from the measured speed (still in the LR
            # warm-up, which does not depend on the plan; a plan that fits is left unchanged,
            # so the run stays reproducible)
            if cuda:
                torch.cuda.synchronize()
            per_step = (time.time() - t_calib) / args.calib_steps
            budget_left = args.time_budget_s - (time.time() - t_train)
            fit = step + int(budget_left / (per_step * 1.08))  # ~8% for evaluations
            if fit < total:
                log(f"plan: {per_step * 1000:.1f} ms/step; {total} planned steps do not fit "
                    f"{args.time_budget_s:.0f}s, cut to {fit}")
                time_cut = True
                total = max(fit, step + 1)
            else:
                log(f"plan: {per_step * 1000:.1f} ms/step -> {total} steps, ~{total * per_step * 1.08:.0f}s")
            log(f"plan: {total} steps = {total / steps_per_epoch:.1f} epochs, "
                f"{total * args.batch_size * args.seq_len:,} tokens")
        if step == 5:
            if cuda:
                torch.cuda.synchronize()
            t_calib = time.time()
        if eval_every is None and total < 10 ** 9:
            eval_every = max(10, total // 20)
        if not qat_on and args.qat_frac > 0 and total < 10 ** 9 and step >= int(total * (1 - args.qat_frac)):
            qat_on = True
            set_fake_quant(model, True)
            log(f"step {step}: quantisation-aware training on (experts through MXFP4)")

        lr = lr_at(step, total)
        for g in opt.param_groups:
            g["lr"] = lr
        w = batches.next().to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            out = model(input_ids=w[:, :-1], use_cache=False, output_router_logits=True)
            ce = F.cross_entropy(out.logits.float().reshape(-1, out.logits.shape[-1]), w[:, 1:].reshape(-1))
            aux = out.aux_loss
        loss = ce + args.aux_coef * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        step += 1
        tokens_seen += w[:, 1:].numel()

        if step % args.log_every == 0 or step == total:
            ce_v, aux_v, gn = ce.item(), aux.item(), gnorm.item()
            el = time.time() - t_train
            curve.append({"step": step, "loss": round(ce_v, 5), "aux": round(aux_v, 4), "lr": lr,
                          "grad_norm": round(gn, 4), "elapsed_s": round(el, 2)})
            log(f"step {step}/{total if total < 10 ** 9 else '?'} loss {ce_v:.4f} aux {aux_v:.3f} "
                f"lr {lr:.2e} |g| {gn:.2f} {tokens_seen / el:,.0f} tok/s epoch {batches.epoch}")
            if not math.isfinite(ce_v):
                raise SystemExit("loss is not finite")
        if eval_every and (step % eval_every == 0 or step == total):
            run_eval(step)
        if time.time() - t_train > args.time_budget_s * 1.1 + 30 and time_planned:
            stopped_by_time = True
            log(f"time budget exceeded at step {step}; stopping")
            break
    if not evals or evals[-1]["step"] != step:
        run_eval(step)
    train_time = time.time() - t_train
    log(f"trained {step} steps, {tokens_seen:,} tokens in {train_time:.1f}s; "
        f"best valid (MXFP4) {best['loss']:.4f} at step {best['step']}")

    # -- export -------------------------------------------------------------
    chosen_step = step if args.keep_last else best["step"]
    state = ({k: v.detach().cpu() for k, v in model.state_dict().items()} if args.keep_last else best["state"])
    state = {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}
    tensors, dequant = export_tensors(state)
    log(f"MXFP4 round trip through transformers' convert_moe_packed_tensors: exact "
        f"({len(dequant)} expert tensors)")

    model_path = os.path.join(args.out, "model.safetensors")
    safetensors.torch.save_file(tensors, model_path, metadata={"format": "pt"})
    os.chmod(model_path, 0o644)
    file_bytes = os.path.getsize(model_path)
    log(f"model.safetensors: {file_bytes:,} bytes (estimate {stats['file_bytes_estimate']:,})")

    cfg4 = config_json_4x(config, args)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg4, f, indent=2)
        f.write("\n")
    gen = {"bos_token_id": ids["<|startoftext|>"], "do_sample": True,
           "eos_token_id": [ids["<|return|>"], ids["<|endoftext|>"], ids["<|call|>"]],
           "pad_token_id": ids["<|endoftext|>"], "transformers_version": transformers.__version__}
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
        f.write("\n")
    tok.save(os.path.join(args.out, "tokenizer.json"))
    with open(args.chat_template, encoding="utf-8") as f:
        chat_template = f.read()
    shutil.copyfile(args.chat_template, os.path.join(args.out, "chat_template.jinja"))
    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config(tok, chat_template, args.max_position_embeddings), f, indent=2)
        f.write("\n")

    # -- final evaluation: transformers' own forward, float32, weights as stored ----
    bf16_weights = {k: v.float() for k, v in tensors.items() if not k.endswith(("_blocks", "_scales"))}
    bf16_weights.update({k: state[k].to(torch.bfloat16).float() for k in dequant})
    mx_weights = dict(bf16_weights)
    mx_weights.update(dequant)
    m_bf16 = model_from_weights(config, bf16_weights, device)
    vl_bf16 = evaluate(m_bf16, v_windows, args.eval_batch, device, False)
    del m_bf16
    m_mx = model_from_weights(config, mx_weights, device)
    vl_mx = evaluate(m_mx, v_windows, args.eval_batch, device, False)
    tl_mx = evaluate(m_mx, t_windows, args.eval_batch, device, False)
    log(f"valid loss / ppl: bf16 {vl_bf16:.4f} / {math.exp(vl_bf16):.2f}; "
        f"MXFP4 {vl_mx:.4f} / {math.exp(vl_mx):.2f}; train-sample (MXFP4) {tl_mx:.4f} / {math.exp(tl_mx):.2f}")
    samples = []
    if not args.no_samples:
        prompts = ["fn main() {", "The borrow checker", "In Rust, a trait is",
                   "## Ownership\n\n", "let v: Vec<i32> ="]
        samples = greedy_samples(m_mx, tok, prompts, device, 40,
                                 [ids["<|endoftext|>"], ids["<|return|>"], ids["<|call|>"]])
        for s in samples:
            log(f"sample {s['prompt']!r} -> {s['completion']!r}")
    if args.save_float:
        m_mx.save_pretrained(os.path.join(args.out, "float-reference"), safe_serialization=True)
    del m_mx

    corpus_manifest = {}
    mpath = os.path.join(args.corpus, "manifest.json")
    if os.path.exists(mpath):
        with open(mpath) as f:
            corpus_manifest = json.load(f)
    log_obj = {
        "seed": args.seed,
        "args": vars(args),
        "device": torch.cuda.get_device_name(device) if cuda else platform.processor() or "cpu",
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                     "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                     "safetensors": safetensors.__version__, "numpy": np.__version__,
                     "cuda": torch.version.cuda},
        "data": {"train_docs": len(train_docs), "valid_docs": len(valid_docs),
                 "train_bytes": train_bytes, "valid_bytes": sum(len(d.encode()) for d in valid_docs),
                 "train_tokens": int(len(train_stream)), "valid_tokens": int(len(valid_stream)),
                 "corpus_sha256": {k: corpus_manifest.get(k, {}).get("sha256") for k in ("train", "valid")},
                 "rustc": corpus_manifest.get("rustc")},
        "params": stats,
        "file_bytes": file_bytes,
        "steps": step, "planned_steps": total, "plan_cut_by_time_budget": time_cut,
        "stopped_by_time": stopped_by_time,
        "steps_per_epoch": round(steps_per_epoch, 2), "epochs": round(step / steps_per_epoch, 2),
        "tokens_seen": tokens_seen, "seq_len": args.seq_len, "batch_size": args.batch_size,
        "exported_step": chosen_step, "best_valid_loss_mxfp4_during_training": best["loss"],
        "valid_tokens": int(sum(len(w) - 1 for w in v_windows)),
        "valid_loss_bf16": vl_bf16, "valid_ppl_bf16": math.exp(vl_bf16),
        "valid_loss_mxfp4": vl_mx, "valid_ppl_mxfp4": math.exp(vl_mx),
        "train_sample_loss_mxfp4": tl_mx, "train_sample_ppl_mxfp4": math.exp(tl_mx),
        "patched_forward_max_dlogit": diff,
        "train_time_s": round(train_time, 1),
        "wall_time_s": round(time.time() - T_START, 1),
        "loss_curve": curve, "evals": evals, "samples": samples,
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "reproduce": ("the same command reproduces this run on the same hardware and software"
                      if not (time_cut or stopped_by_time) else
                      f"the time budget shortened this run; add --max-steps {total} to replan it identically"),
    }
    log_obj["sha256"] = {"model.safetensors": sha256(model_path),
                         "tokenizer.json": sha256(os.path.join(args.out, "tokenizer.json"))}
    with open(os.path.join(args.out, "training_log.json"), "w") as f:
        json.dump(log_obj, f, indent=1)
        f.write("\n")

    data_md = "The Rust Programming Language, Rust by Example and The Rust Reference, as shipped with the Rust toolchain."
    spath = os.path.join(args.corpus, "SOURCES.md")
    if os.path.exists(spath):
        with open(spath, encoding="utf-8") as f:
            s = f.read()
        data_md = s.split("\n", 1)[1].strip()  # drop the title
        data_md = data_md.split("## Licence")[0].strip()
    recipe = (
        f"From scratch, seed {args.seed}. AdamW (β 0.9/0.95, weight decay {args.weight_decay} on matrices), "
        f"peak LR {args.lr:g} after {args.warmup_steps} warm-up steps, cosine to {args.min_lr_frac:g}× peak, "
        f"gradient clip {args.grad_clip:g}, batch {args.batch_size} × {args.seq_len} tokens, bf16 autocast "
        f"(float32 master weights), dropout {args.dropout:g} on attention and expert outputs (training only), "
        f"router load-balancing loss × {args.aux_coef:g}. The last {args.qat_frac:.0%} of the steps train through "
        f"MXFP4 fake quantisation of the expert weights (straight-through). {step} steps "
        f"({step / steps_per_epoch:.1f} epochs, {tokens_seen:,} tokens) in {train_time:.0f} s on "
        f"{log_obj['device']}; the exported weights are those of step {chosen_step}, the best validation loss "
        f"(with MXFP4 experts) of the evaluations every {eval_every} steps. Experts quantised to MXFP4 per 32-value "
        f"block (E8M0 scale chosen from two candidates by squared error, E2M1 values rounded to nearest). "
        f"Script: `tools/train-demo/train.py` (torch {torch.__version__}, transformers {transformers.__version__}).")
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write(model_card({"config": cfg4, "recipe": recipe, "log": log_obj, "params": stats,
                            "file_bytes": file_bytes, "data_md": data_md}))
    log(f"wrote {args.out}: " + ", ".join(sorted(os.listdir(args.out))))


if __name__ == "__main__":
    main()
