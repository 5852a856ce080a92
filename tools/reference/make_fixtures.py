#!/usr/bin/env python3
"""Build tiny RANDOM Hugging Face models and record transformers' reference outputs.

Every fixture is a small causal LM built with transformers itself (hidden 64,
2-6 layers, vocab 256), initialised from a fixed torch seed, with every norm
weight, every bias and every attention sink perturbed away from its init value
so that an engine that forgets a term (a bias, a norm scale, q/k norm, rope
scaling, a sliding window, a sink, a clamp, a softcap) produces visibly
different logits.  Families: Llama, Mistral, Qwen2, Qwen3, gpt-oss (plain and
MXFP4 experts), Gemma2, Gemma3, Qwen3-MoE, Mixtral.

For fixture ``<name>`` the script writes ``<out>/<name>/``:

* ``config.json``, ``model.safetensors``, ``generation_config.json`` -- the model
  as written by ``save_pretrained(safe_serialization=True)`` (``gpt-oss-mxfp4``:
  written by hand in the released MXFP4 layout, see ``write_mxfp4_checkpoint``,
  and the reference is transformers' own loading of those files); for fixtures whose
  ``config_spelling`` is ``"4.x"`` config.json is afterwards rewritten into the
  transformers 4.x spelling (top-level ``rope_theta``, ``rope_scaling`` and
  ``torch_dtype`` instead of ``rope_parameters`` and ``dtype``).
* ``logits.npy`` -- float32 logits for every position of the input sequence,
  shape ``[n_tokens, vocab]``, little-endian, C order; one eager-attention
  forward over the whole sequence in float32 under ``torch.no_grad()``.
* ``reference.json`` -- ``tokens``, ``greedy`` (16 greedy ids; EOS ignored),
  ``transformers``, ``torch``, ``description``, ``config_spelling``,
  ``weights_dtype`` (and ``expert_weights: "mxfp4"`` for the MXFP4 fixture).

Each fixture is verified by reloading it from disk with
``AutoModelForCausalLM.from_pretrained`` and comparing logits; the greedy ids
are re-checked against a single teacher-forced forward pass.  For every fixture
the script also prints how much the logits move under a few "mutations" (the
mistakes an engine could make), which is the sensitivity table in README.md.

Usage::

    /opt/refenv/bin/python tools/reference/make_fixtures.py [--out tests/fixtures] [names...]

Adding a family: write one function decorated with ``@fixture("name")`` that
returns a ``FixtureSpec`` (model class, config, seed, token count, spelling,
weights dtype, a list of mutations and checks, optionally a ``prepare`` hook, a
checkpoint ``writer`` and ``load_kwargs``).  Everything else is shared.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import shutil
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import safetensors.torch
import torch
import transformers
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GenerationConfig,
    GptOssConfig,
    GptOssForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Mxfp4Config,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention, GptOssExperts, GptOssTopKRouter
from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter

# ---------------------------------------------------------------------------
# Shared recipe
# ---------------------------------------------------------------------------

VOCAB = 256
GREEDY_TOKENS = 16
NORM_PERTURB = 0.3  # norm weight += 0.3 * N(0, 1)  (1 + 0.3 N for ones-initialised norms)
BIAS_PERTURB = 0.2  # bias += 0.2 * N(0, 1)
SINK_PERTURB = 1.0  # attention sink logit += 1.0 * N(0, 1)  (gpt-oss)
RELOAD_TOL = 1e-5
MIN_SENSITIVITY = 1e-2  # required max|d logits| / std(logits) for every mutation
MIN_ROUTER_GAP = 1e-3  # MoE: smallest k-th minus (k+1)-th router logit over prompt + greedy tokens
MAX_MODEL_BYTES = 1 << 20  # model.safetensors
MAX_FIXTURE_BYTES = 3 << 19  # whole fixture directory (1.5 MiB)

# Config fields shared by every fixture (a family function may override them).
BASE_CONFIG = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=256,
    initializer_range=0.1,
)

# A mutation maps the reference model (float32, eval, eager) to a new model.
Mutation = Callable[[PreTrainedModel], PreTrainedModel]


@dataclass
class FixtureSpec:
    description: str
    model_cls: type
    config: transformers.PretrainedConfig
    seed: int
    n_tokens: int
    config_spelling: str = "5.x"  # "4.x" -> config.json rewritten after saving
    weights_dtype: str = "float32"  # "float32" | "bfloat16" (dtype of the saved tensors)
    mutations: list[tuple[str, Mutation]] = field(default_factory=list)
    # Extra assertions about transformers' behaviour: fn(model, tokens, logits) -> message.
    checks: list[Callable[[PreTrainedModel, list[int], np.ndarray], str]] = field(default_factory=list)
    # Family-specific weight changes after perturb_ (e.g. scale expert weights so a clamp bites).
    prepare: Callable[[PreTrainedModel], None] | None = None
    # Writes the checkpoint (5.x config + weights) instead of save_pretrained: fn(model, dir).  The
    # reference model is then whatever transformers loads back from that directory.
    writer: Callable[[PreTrainedModel, Path], None] | None = None
    # Extra from_pretrained kwargs; a factory, because quantization configs are mutated while loading.
    load_kwargs: Callable[[], dict] = dict
    # Keyword arguments for rewrite_config_4x (renamed / kept / added keys).
    config_4x: dict = field(default_factory=dict)
    # Extra entries for reference.json.
    reference_extra: dict = field(default_factory=dict)


FIXTURES: dict[str, Callable[[], FixtureSpec]] = {}


def fixture(name: str):
    """Register a function returning a FixtureSpec under ``name``."""

    def register(fn: Callable[[], FixtureSpec]):
        FIXTURES[name] = fn
        return fn

    return register


def make_config(config_cls, **overrides):
    kw = dict(BASE_CONFIG)
    kw.update(overrides)
    return config_cls(**kw)


# ---------------------------------------------------------------------------
# Model construction and evaluation helpers
# ---------------------------------------------------------------------------


def is_norm_weight(name: str) -> bool:
    return name.endswith(".weight") and "norm" in name.rsplit(".", 2)[-2]


def perturb_(model: PreTrainedModel) -> None:
    """Move every norm weight and every bias away from its init (uses the global RNG)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if is_norm_weight(name):
                p.add_(NORM_PERTURB * torch.randn_like(p))
            elif name.endswith(".bias") or name.endswith("_bias"):  # "_bias": gpt-oss expert biases
                p.add_(BIAS_PERTURB * torch.randn_like(p))
            elif name.endswith(".sinks"):
                p.add_(SINK_PERTURB * torch.randn_like(p))


def build_model(spec: FixtureSpec) -> PreTrainedModel:
    torch.manual_seed(spec.seed)
    config = copy.deepcopy(spec.config)
    config._attn_implementation = "eager"
    model = spec.model_cls(config).to(torch.float32).eval()
    perturb_(model)
    if spec.prepare is not None:
        with torch.no_grad():
            spec.prepare(model)
    return model


def make_tokens(spec: FixtureSpec) -> list[int]:
    gen = torch.Generator().manual_seed(spec.seed + 1)
    return torch.randint(0, VOCAB, (spec.n_tokens,), generator=gen).tolist()


@torch.no_grad()
def forward_logits(model: PreTrainedModel, tokens: list[int]) -> np.ndarray:
    ids = torch.tensor([tokens], dtype=torch.long)
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    return out.logits[0].to(torch.float32).numpy()


@torch.no_grad()
def greedy(model: PreTrainedModel, tokens: list[int]) -> list[int]:
    ids = torch.tensor([tokens], dtype=torch.long)
    # A fresh GenerationConfig: no EOS (never stops early), no logits processors.
    gen_cfg = GenerationConfig(
        do_sample=False,
        max_new_tokens=GREEDY_TOKENS,
        min_new_tokens=GREEDY_TOKENS,
        eos_token_id=None,
        pad_token_id=0,
        bos_token_id=None,
    )
    out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gen_cfg)
    new = out[0, len(tokens):].tolist()
    assert len(new) == GREEDY_TOKENS, new
    return new


def rebuild_with_config(model: PreTrainedModel, **changes) -> PreTrainedModel:
    """Same weights, different config (RNG state is preserved)."""
    config = copy.deepcopy(model.config)
    for k, v in changes.items():
        setattr(config, k, v)
    config._attn_implementation = "eager"
    with torch.random.fork_rng():
        new = type(model)(config).to(torch.float32).eval()
    new.load_state_dict(model.state_dict(), strict=True)
    return new


# --- reusable mutations -----------------------------------------------------


def set_params(predicate: Callable[[str], bool], value: float) -> Mutation:
    def mutate(model):
        m = copy.deepcopy(model)
        hits = 0
        with torch.no_grad():
            for name, p in m.named_parameters():
                if predicate(name):
                    p.fill_(value)
                    hits += 1
        assert hits, "mutation matched no parameter"
        return m

    return mutate


def zero_biases(*parts: str) -> Mutation:
    """Zero biases whose name contains any of ``parts`` (all biases if none given)."""
    return set_params(lambda n: n.endswith(".bias") and (not parts or any(s in n for s in parts)), 0.0)


def reset_norms(*parts: str) -> Mutation:
    """Set norm weights (whose name contains any of ``parts``, or all) back to 1."""
    return set_params(lambda n: is_norm_weight(n) and (not parts or any(s in n for s in parts)), 1.0)


def with_config(**changes) -> Mutation:
    return lambda model: rebuild_with_config(model, **changes)


def replace_modules(attr_names: tuple[str, ...], factory=torch.nn.Identity) -> Mutation:
    """Replace e.g. self_attn.q_norm in every layer by Identity (term skipped entirely)."""

    def mutate(model):
        m = copy.deepcopy(model)
        for layer in m.model.layers:
            for attr in attr_names:
                owner_path, _, leaf = attr.rpartition(".")
                owner = layer.get_submodule(owner_path) if owner_path else layer
                setattr(owner, leaf, factory())
        return m

    return mutate


def transform_params(predicate: Callable[[str], bool], fn: Callable[[torch.Tensor], torch.Tensor]) -> Mutation:
    """Replace every parameter whose name matches by ``fn(parameter)`` (same shape)."""

    def mutate(model):
        m = copy.deepcopy(model)
        hits = 0
        with torch.no_grad():
            for name, p in m.named_parameters():
                if predicate(name):
                    p.copy_(fn(p.detach().clone()))
                    hits += 1
        assert hits, "mutation matched no parameter"
        return m

    return mutate


def patch_modules(module_cls: type, **methods: Callable) -> Mutation:
    """Override methods (e.g. ``forward``) on every ``module_cls`` instance of a copy of the model."""

    def mutate(model):
        m = copy.deepcopy(model)
        hits = 0
        for module in m.modules():
            if isinstance(module, module_cls):
                for attr, fn in methods.items():
                    setattr(module, attr, types.MethodType(fn, module))
                hits += 1
        assert hits, f"no {module_cls.__name__} in the model"
        return m

    return mutate


def set_buffers(suffix: str, value: float) -> Mutation:
    """Fill every (non-persistent) buffer whose name ends with ``suffix``, e.g. Gemma's embed_scale."""

    def mutate(model):
        m = copy.deepcopy(model)
        hits = [b.fill_(value) for name, b in m.named_buffers() if name.endswith(suffix)]
        assert hits, f"no buffer *{suffix}"
        return m

    return mutate


def swap_halves(dim: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """[a; b] -> [b; a] along ``dim`` (gate/up swapped in a concatenated gate_up_proj)."""
    return lambda t: torch.cat(t.chunk(2, dim=dim)[::-1], dim=dim)


def interleave_halves(t: torch.Tensor) -> torch.Tensor:
    """Last dim [g0..gn, u0..un] -> [g0, u0, g1, u1, ...].  Feeding this to gpt-oss (gate = even columns)
    reproduces an engine that splits gate_up into halves instead of even/odd columns."""
    g, u = t.chunk(2, dim=-1)
    return torch.stack([g, u], dim=-1).flatten(-2)


# --- behaviour checks ---------------------------------------------------------


def check_sliding_window(window: int, tol: float = 0.0, **no_window):
    """Assert the eager sliding-window semantics: query i attends to keys i-window < j <= i.

    ``no_window``: the config change that removes the window (default ``sliding_window=None``; models
    with ``layer_types`` use ``layer_types=all_full(n)``).  ``tol``: MoE models group tokens per expert,
    and the grouped GEMMs round a row differently when the other rows change, so "identical" there
    means within ``tol`` (and "differs" means by more than 100 x tol)."""
    no_window = no_window or {"sliding_window": None}
    differs = 100 * tol

    def check(model, tokens, logits):
        full = forward_logits(rebuild_with_config(model, **no_window), tokens)
        wider = forward_logits(rebuild_with_config(model, sliding_window=window + 1), tokens)
        diff = np.abs(full - logits).max(-1)
        assert np.all(diff[:window] <= tol), f"window changes positions < {window}: {diff[:window]}"
        assert np.all(diff[window:] > differs), "sliding window not applied"
        wdiff = np.abs(wider - logits).max(-1)
        # key 0 is dropped first at query `window`
        assert np.all(wdiff[:window] <= tol) and wdiff[window] > differs, wdiff
        same = "identical to" if tol == 0 else f"within {tol:g} of"
        return (f"sliding window applied in eager: positions 0..{window - 1} {same} full causal, "
                f"max|diff| vs no window {diff.max():.4f}; window {window + 1} first differs at "
                f"position {window} => query i sees the {window} keys j with i-{window} < j <= i")

    return check


# ---------------------------------------------------------------------------
# Config spelling
# ---------------------------------------------------------------------------


def rope_scaling_4x(rp: dict) -> dict | None:
    """5.x rope_parameters minus rope_theta -> 4.x rope_scaling (null for plain default rope)."""
    rp = {k: v for k, v in rp.items() if k != "rope_theta"}
    return None if rp.get("rope_type", "default") == "default" and len(rp) <= 1 else rp


def rewrite_config_4x(path: Path, renames: dict | None = None, keep: tuple[str, ...] = (),
                      add: dict | None = None) -> dict:
    """Rewrite a 5.x config.json into the spelling of real (4.x-era) checkpoints.

    ``renames`` maps 5.x keys to the names released configs use (e.g. Qwen3-MoE's ``num_experts``),
    ``keep`` lists keys normally dropped that a release does carry (gpt-oss has ``layer_types``),
    ``add`` adds release-only keys (e.g. Gemma3's ``sliding_window_pattern``).
    """
    renames = renames or {}
    cfg = json.loads(path.read_text())
    out = {}
    for k, v in cfg.items():
        if k == "dtype":
            out["torch_dtype"] = v
        elif k == "rope_parameters" and "full_attention" in v:
            # Gemma3: per-layer-type rope -> rope_theta (global), rope_local_base_freq, rope_scaling (global)
            local = dict(v["sliding_attention"])
            out["rope_local_base_freq"] = local.pop("rope_theta")
            assert local.get("rope_type", "default") == "default" and len(local) <= 1, local
            out["rope_theta"] = v["full_attention"]["rope_theta"]
            out["rope_scaling"] = rope_scaling_4x(v["full_attention"])
        elif k == "rope_parameters":
            out["rope_theta"] = v["rope_theta"]
            out["rope_scaling"] = rope_scaling_4x(v)
        elif k == "layer_types" and k not in keep:
            continue  # 4.x-era checkpoints don't carry it; transformers re-derives it
        elif k.startswith("_"):
            continue  # transformers-internal attribute (Gemma3 writes _sliding_window_pattern)
        else:
            out[renames.get(k, k)] = v
    out.update(add or {})
    assert "rope_theta" in out and "torch_dtype" in out, out
    path.write_text(json.dumps(dict(sorted(out.items())), indent=2) + "\n")
    return out


# ---------------------------------------------------------------------------
# Fixture pipeline
# ---------------------------------------------------------------------------


def load_from_disk(d: Path, **kw) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager", **kw).eval()


def save_model(model: PreTrainedModel, d: Path, weights_dtype: str) -> None:
    """Save ``model``; afterwards its float32 parameters equal exactly what was saved."""
    if weights_dtype == "bfloat16":
        # Round the parameters only: model.to(bf16) would also round non-persistent buffers
        # (rotary inv_freq), which a reload recomputes in float32.
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).to(torch.float32))
        copy.deepcopy(model).to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
    elif weights_dtype == "float32":
        model.save_pretrained(d, safe_serialization=True)
    else:
        raise ValueError(weights_dtype)
    (d / "model.safetensors").chmod(0o644)


def check_greedy(model: PreTrainedModel, tokens: list[int], logits: np.ndarray, greedy_ids: list[int]) -> float:
    """Greedy ids must be the plain argmax of one teacher-forced pass; returns the min top1-top2 margin."""
    tf = forward_logits(model, tokens + greedy_ids)
    steps = tf[len(tokens) - 1 : -1]
    assert steps.argmax(-1).tolist() == greedy_ids, f"generate() {greedy_ids} != argmax {steps.argmax(-1)}"
    assert np.array_equal(tf[: len(tokens)].argmax(-1), logits.argmax(-1))
    top2 = np.sort(steps, axis=-1)[:, -2:]
    return float((top2[:, 1] - top2[:, 0]).min())


@torch.no_grad()
def router_gap(model: PreTrainedModel, tokens: list[int]) -> float | None:
    """MoE: the smallest gap between the k-th and (k+1)-th router logit over every token and layer
    (None for dense models).  A small gap would let rounding noise change which experts run."""
    k = getattr(model.config, "num_experts_per_tok", None)
    if k is None:
        return None
    ids = torch.tensor([tokens], dtype=torch.long)
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False, output_router_logits=True)
    assert out.router_logits, "no router logits recorded"
    top = [torch.sort(r.float(), dim=-1, descending=True).values for r in out.router_logits]
    return float(min((t[:, k - 1] - t[:, k]).min() for t in top))


def apply_spelling(d: Path, spec: FixtureSpec, tokens: list[int]) -> None:
    """For "4.x": rewrite config.json and assert transformers loads it to the identical model."""
    if spec.config_spelling == "5.x":
        return
    if spec.config_spelling != "4.x":
        raise ValueError(spec.config_spelling)
    before = load_from_disk(d, dtype=torch.float32, **spec.load_kwargs())
    rewrite_config_4x(d / "config.json", **spec.config_4x)
    after = load_from_disk(d, **spec.load_kwargs())  # no dtype: exactly as a user would load it
    assert after.dtype == getattr(torch, spec.weights_dtype), after.dtype  # from torch_dtype
    if after.dtype != torch.float32:
        after = load_from_disk(d, dtype=torch.float32, **spec.load_kwargs())
    assert after.config.rope_parameters == before.config.rope_parameters, (
        after.config.rope_parameters, before.config.rope_parameters)
    assert np.array_equal(forward_logits(after, tokens), forward_logits(before, tokens)), "4.x spelling changes logits"


def generate_fixture(name: str, out_root: Path) -> dict:
    spec = FIXTURES[name]()
    d = out_root / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)

    model = build_model(spec)
    tokens = make_tokens(spec)
    if spec.writer is None:
        save_model(model, d, spec.weights_dtype)
    else:
        # Hand-written checkpoint: the reference is transformers' own reading of those files.
        spec.writer(model, d)
        model = load_from_disk(d, dtype=torch.float32, **spec.load_kwargs())
    logits = forward_logits(model, tokens)
    greedy_ids = greedy(model, tokens)
    margin = check_greedy(model, tokens, logits, greedy_ids)
    gap = router_gap(model, tokens + greedy_ids)
    apply_spelling(d, spec, tokens)

    reloaded = load_from_disk(d, dtype=torch.float32, **spec.load_kwargs())
    reload_diff = float(np.abs(forward_logits(reloaded, tokens) - logits).max())
    assert reload_diff < RELOAD_TOL, f"{name}: reloaded logits differ by {reload_diff}"

    np.save(d / "logits.npy", np.ascontiguousarray(logits, dtype="<f4"), allow_pickle=False)
    reference = {
        "tokens": tokens,
        "greedy": greedy_ids,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "description": spec.description,
        "config_spelling": spec.config_spelling,
        "weights_dtype": spec.weights_dtype,
        **spec.reference_extra,
    }
    (d / "reference.json").write_text(dump_json(reference))

    notes = [check(model, tokens, logits) for check in spec.checks]
    std = float(logits.std())
    rows = []
    for label, mutate in spec.mutations:
        diff = float(np.abs(forward_logits(mutate(model), tokens) - logits).max())
        rows.append((label, diff, diff / std))

    size = sum(f.stat().st_size for f in d.iterdir())
    print(f"\n== {name}: {len(tokens)} tokens, logits {logits.shape}, std {std:.4f}, "
          f"reload max|diff| {reload_diff:.2e}, dir {size / 1024:.0f} KiB")
    print(f"   greedy: {greedy_ids} ({len(set(greedy_ids))} distinct, min top1-top2 margin {margin:.4f})")
    if gap is not None:
        print(f"   router: min gap between the k-th and (k+1)-th expert logit {gap:.4f} (prompt + greedy)")
        assert gap >= MIN_ROUTER_GAP, f"{name}: router near-tie {gap}"
    for note in notes:
        print(f"   check: {note}")
    for label, diff, rel in rows:
        print(f"   mutation {label!r}: max|dlogit| {diff:.4f} ({rel:.3f} x std)")
    bad = [label for label, _, rel in rows if rel <= MIN_SENSITIVITY]
    assert not bad, f"{name}: insensitive to {bad}"
    assert (d / "model.safetensors").stat().st_size < MAX_MODEL_BYTES, "model over 1 MiB"
    assert size < MAX_FIXTURE_BYTES, "fixture over 1.5 MiB"
    return dict(name=name, n_tokens=len(tokens), std=std, margin=margin, mutations=rows, size=size)


def dump_json(obj: dict) -> str:
    """Pretty JSON with lists of ints kept on one line."""
    body = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in obj.items())
    return "{\n" + body + "\n}\n"


def markdown_table(results: list[dict]) -> str:
    lines = [
        "| fixture | tokens | logit std | greedy margin | mutation | max abs dlogit | / std |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for i, (label, diff, rel) in enumerate(r["mutations"]):
            head = (f"| `{r['name']}` | {r['n_tokens']} | {r['std']:.3f} | {r['margin']:.4f} "
                    if i == 0 else "| | | | ")
            lines.append(f"{head}| {label} | {diff:.4f} | {rel:.3f} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Family helpers: gpt-oss (MXFP4, sinks, clamped SwiGLU, YaRN), Gemma, MoE
# ---------------------------------------------------------------------------


def alternating(first: str, second: str, n: int) -> list[str]:
    return [first if i % 2 == 0 else second for i in range(n)]


def all_full(n: int) -> list[str]:
    return ["full_attention"] * n


def scale_params(**factors: float) -> Callable[[PreTrainedModel], None]:
    """A ``prepare`` hook: multiply every parameter whose name ends with ``.<key>`` by the factor."""

    def prepare(model):
        for key, factor in factors.items():
            hits = [p.mul_(factor) for n, p in model.named_parameters() if n.endswith("." + key)]
            assert hits, key

    return prepare


@torch.no_grad()
def record_calls(model: PreTrainedModel, module_cls: type, method: str, tokens: list[int]) -> list:
    """Run one forward pass on a copy of ``model`` and return the first argument of every call to
    ``module_cls.<method>`` (e.g. the gate_up activations that reach gpt-oss's clamp)."""
    seen = []

    def spy(self, x, *args, **kw):
        seen.append(x.detach().clone())
        return getattr(module_cls, method)(self, x, *args, **kw)

    forward_logits(patch_modules(module_cls, **{method: spy})(model), tokens)
    return seen


MOE_TOL = 1e-5  # see check_sliding_window


def check_experts_eager(model, tokens, logits):
    """transformers' default experts path on CPU is ``grouped_mm``; the loop in modeling_*.py must agree."""
    eager = forward_logits(rebuild_with_config(model, _experts_implementation="eager"), tokens)
    diff = float(np.abs(eager - logits).max())
    assert model.config._experts_implementation == "grouped_mm", model.config._experts_implementation
    assert diff < MOE_TOL, diff
    return f"experts_implementation grouped_mm (default) vs eager loop: max|diff| {diff:.1e}"


# --- YaRN ------------------------------------------------------------------------


def yarn_inv_freq(head_dim: int, theta: float, factor: float, original_max: int, beta_fast: float,
                  beta_slow: float, truncate: bool) -> tuple[np.ndarray, float]:
    """transformers' _compute_yarn_parameters, written out in float64 (see README)."""
    pos_freqs = theta ** (np.arange(0, head_dim, 2) / head_dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)

    def correction_dim(rotations):
        return head_dim * math.log(original_max / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(head_dim // 2) - low) / (high - low), 0, 1)
    keep = 1 - ramp  # 1: original frequency (extrapolation), 0: divided by factor (interpolation)
    inv_freq = interpolation * (1 - keep) + extrapolation * keep
    attention_factor = 0.1 * math.log(factor) + 1.0
    return inv_freq, attention_factor


def check_yarn(model, tokens, logits):
    rp = model.config.rope_parameters
    want, want_af = yarn_inv_freq(model.config.head_dim, rp["rope_theta"], rp["factor"],
                                  rp["original_max_position_embeddings"], rp["beta_fast"], rp["beta_slow"],
                                  rp["truncate"])
    rotary = model.model.rotary_emb
    got = rotary.inv_freq.numpy()
    assert np.allclose(got, want, rtol=2e-6, atol=0), (got, want)
    assert abs(rotary.attention_scaling - want_af) < 1e-12, rotary.attention_scaling
    return (f"YaRN inv_freq (f32) {np.array2string(got, precision=6, separator=', ')} "
            f"= float64 formula within 2e-6; attention_factor {rotary.attention_scaling!r}")


# --- gpt-oss -----------------------------------------------------------------------

GPT_OSS_LAYERS = 4
GPT_OSS_ROPE = dict(rope_type="yarn", rope_theta=150000.0, factor=32.0, beta_fast=32.0, beta_slow=1.0,
                    truncate=False, original_max_position_embeddings=32)
GPT_OSS_NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]


def gpt_oss_config() -> GptOssConfig:
    return make_config(
        GptOssConfig, num_hidden_layers=GPT_OSS_LAYERS, num_key_value_heads=2, head_dim=16,
        intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
        layer_types=alternating("sliding_attention", "full_attention", GPT_OSS_LAYERS),
        max_position_embeddings=1024, rms_norm_eps=1e-5, swiglu_limit=7.0, tie_word_embeddings=False,
        rope_parameters=dict(GPT_OSS_ROPE))


# Expert weights N(0, 0.4) (gate_up) and N(0, 0.025) (down): a few percent of the gate/up
# pre-activations pass +-7, so the clamp changes the logits.
gpt_oss_prepare = scale_params(gate_up_proj=4.0, down_proj=0.25)


def check_swiglu_clamp(model, tokens, logits):
    gate_up = torch.cat(record_calls(model, GptOssExperts, "_apply_gate", tokens))
    limit = model.config.swiglu_limit
    gate, up = gate_up[:, ::2], gate_up[:, 1::2]
    g_hi, u_out = float((gate > limit).float().mean()), float((up.abs() > limit).float().mean())
    assert g_hi > 0.005 and u_out > 0.005, (g_hi, u_out)
    return (f"swiglu clamp active: {100 * g_hi:.1f}% of gate values > {limit}, {100 * u_out:.1f}% of up "
            f"values outside +-{limit} (max |gate_up| {float(gate_up.abs().max()):.1f})")


def gpt_oss_router_softmax_all(self, hidden_states):
    """Bug: softmax over all experts, then top-k, no renormalisation (Mixtral without renorm)."""
    logits = torch.nn.functional.linear(hidden_states, self.weight, self.bias)
    top, idx = torch.topk(torch.softmax(logits, dim=-1), self.top_k, dim=-1)
    return logits, top, idx


def gpt_oss_gate_without_plus_one(self, gate_up):
    """Bug: out = up * glu instead of (up + 1) * glu."""
    gate = gate_up[..., ::2].clamp(max=self.limit)
    up = gate_up[..., 1::2].clamp(min=-self.limit, max=self.limit)
    return up * (gate * torch.sigmoid(gate * self.alpha))


def gpt_oss_bias_after_rope(self, hidden_states, position_embeddings, attention_mask, cache=None, **kwargs):
    """Bug: RoPE applied to x.W, then the q/k biases added (transformers adds them before RoPE)."""
    from transformers.models.gpt_oss.modeling_gpt_oss import apply_rotary_pos_emb, eager_attention_forward

    shape = (*hidden_states.shape[:-1], -1, self.head_dim)

    def heads(x):
        return x.view(shape).transpose(1, 2)

    q = heads(torch.nn.functional.linear(hidden_states, self.q_proj.weight))
    k = heads(torch.nn.functional.linear(hidden_states, self.k_proj.weight))
    v = heads(self.v_proj(hidden_states))
    q, k = apply_rotary_pos_emb(q, k, *position_embeddings)
    q = q + self.q_proj.bias.view(1, -1, 1, self.head_dim)
    k = k + self.k_proj.bias.view(1, -1, 1, self.head_dim)
    out, weights = eager_attention_forward(self, q, k, v, attention_mask, scaling=self.scaling)
    return self.o_proj(out.reshape(*hidden_states.shape[:-1], -1)), weights


def gpt_oss_mutations() -> list[tuple[str, Mutation]]:
    n, rope = GPT_OSS_LAYERS, dict(GPT_OSS_ROPE)
    return [
        ("sinks ignored (no sink term in the softmax)", set_params(lambda s: s.endswith(".sinks"), -math.inf)),
        ("sinks zeroed (sink logit 0)", set_params(lambda s: s.endswith(".sinks"), 0.0)),
        ("no swiglu clamp", with_config(swiglu_limit=1e9)),
        ("(up + 1) replaced by up", patch_modules(GptOssExperts, _apply_gate=gpt_oss_gate_without_plus_one)),
        ("swiglu alpha 1 instead of 1.702", with_config(swiglu_alpha=1.0)),
        ("gate/up as halves instead of even/odd columns",
         transform_params(lambda s: s.endswith(("experts.gate_up_proj", "experts.gate_up_proj_bias")),
                          interleave_halves)),
        ("experts.down_proj used transposed ([E, hidden, width] as if nn.Linear)",
         transform_params(lambda s: s.endswith("experts.down_proj"), lambda t: t.transpose(1, 2))),
        ("router: softmax over all experts, top-k not renormalised",
         patch_modules(GptOssTopKRouter, forward=gpt_oss_router_softmax_all)),
        ("router bias zeroed", zero_biases("mlp.router")),
        ("expert biases zeroed", set_params(lambda s: s.endswith("_bias"), 0.0)),
        ("q/k/v/o biases zeroed", zero_biases("self_attn")),
        ("q/k biases added after RoPE", patch_modules(GptOssAttention, forward=gpt_oss_bias_after_rope)),
        ("YaRN removed (default rope, theta 150000)",
         with_config(rope_parameters={"rope_type": "default", "rope_theta": rope["rope_theta"]})),
        ("YaRN attention_factor 1 (cos/sin not scaled)", with_config(rope_parameters={**rope, "attention_factor": 1.0})),
        ("YaRN truncate true (ramp bounds floored/ceiled)", with_config(rope_parameters={**rope, "truncate": True})),
        ("sliding/full phase inverted", with_config(layer_types=alternating("full_attention", "sliding_attention", n))),
        ("no sliding window (all layers full)", with_config(layer_types=all_full(n))),
        ("window 9 (off by one, wider)", with_config(sliding_window=9)),
        ("window 7 (off by one, narrower)", with_config(sliding_window=7)),
        ("all norm weights = 1", reset_norms()),
    ]


# --- MXFP4 (OCP microscaling FP4, as in the gpt-oss release) ------------------------

# E2M1 code -> value; bit 3 is the sign (code 8 is -0.0).  Same table as transformers' FP4_VALUES.
FP4_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                      dtype=np.float32)
MXFP4_BLOCK = 32


def mxfp4_encode(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Quantize ``w [..., rows, cols]`` in blocks of 32 along cols.

    Returns ``blocks`` uint8 ``[..., rows, cols/32, 16]`` (value 2j of a block in the low nibble of
    byte j, value 2j+1 in the high nibble) and ``scales`` uint8 ``[..., rows, cols/32]`` (E8M0: the
    block's values are multiplied by 2^(scale - 127)).  The scale exponent is the smallest e with
    max|block| / 2^e <= 6; each value is rounded to the nearest E2M1 magnitude (ties to the smaller),
    keeping its sign bit, so small negative values become code 8 (-0.0).
    """
    x = w.astype(np.float64).reshape(*w.shape[:-1], -1, MXFP4_BLOCK)
    amax = np.abs(x).max(-1)
    with np.errstate(divide="ignore"):
        exp = np.where(amax > 0, np.ceil(np.log2(amax / 6.0)), -127.0)
    exp = np.clip(exp, -127, 127).astype(np.int32)
    y = x / np.exp2(exp)[..., None]
    assert np.abs(y).max() <= 6.0
    magnitude = np.abs(np.abs(y)[..., None] - FP4_VALUES[:8].astype(np.float64)).argmin(-1)
    codes = (magnitude | np.where(np.signbit(y), 8, 0)).astype(np.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks.astype(np.uint8), (exp + 127).astype(np.uint8)


def mxfp4_decode(blocks: np.ndarray, scales: np.ndarray, swap_nibbles: bool = False,
                 scale_bias: int = 127) -> np.ndarray:
    """``blocks [..., rows, G, 16]``, ``scales [..., rows, G]`` -> float32 ``[..., rows, G*32]``.
    The keyword arguments only exist to build the wrong decodings used as mutations."""
    lo, hi = blocks & 0x0F, blocks >> 4
    if swap_nibbles:
        lo, hi = hi, lo
    codes = np.stack([lo, hi], axis=-1).reshape(*blocks.shape[:-1], 2 * blocks.shape[-1])
    values = np.ldexp(FP4_VALUES[codes], (scales.astype(np.int32) - scale_bias)[..., None])
    return values.reshape(*blocks.shape[:-2], -1).astype(np.float32)


def is_mxfp4_param(name: str) -> bool:
    return name.endswith(("experts.gate_up_proj", "experts.down_proj"))


def write_mxfp4_checkpoint(model: PreTrainedModel, d: Path) -> None:
    """Write ``model`` as the gpt-oss release stores it: experts as MXFP4 blocks/scales, the rest bf16.

    transformers holds ``gate_up_proj [E, hidden, 2*width]`` and ``down_proj [E, width, hidden]``
    (x @ W); the file stores the transposes, ``[E, out, in]``, in 32-wide blocks along ``in``.
    """
    tensors = {}
    for name, p in model.state_dict().items():
        if is_mxfp4_param(name):
            blocks, scales = mxfp4_encode(p.transpose(1, 2).numpy())
            tensors[name + "_blocks"] = torch.from_numpy(np.ascontiguousarray(blocks))
            tensors[name + "_scales"] = torch.from_numpy(np.ascontiguousarray(scales))
        else:
            tensors[name] = p.to(torch.bfloat16).contiguous()
    safetensors.torch.save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    model.config.save_pretrained(d)
    model.generation_config.save_pretrained(d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = [type(model).__name__]
    cfg["dtype"] = "bfloat16"
    cfg["quantization_config"] = {"modules_to_not_convert": GPT_OSS_NOT_CONVERTED, "quant_method": "mxfp4"}
    (d / "config.json").write_text(json.dumps(dict(sorted(cfg.items())), indent=2) + "\n")


def mxfp4_load_kwargs() -> dict:
    # transformers dequantizes MXFP4 on CPU (no triton kernels); asking for it explicitly also
    # avoids the `accelerate` requirement of the quantized path.
    return {"quantization_config": Mxfp4Config(dequantize=True)}


def load_packed(model: PreTrainedModel) -> dict[str, np.ndarray]:
    path = Path(model.config._name_or_path) / "model.safetensors"
    return {k: v.numpy() for k, v in safetensors.torch.load_file(path).items() if k.endswith(("_blocks", "_scales"))}


def mxfp4_experts(swap_nibbles: bool = False, scale_bias: int = 127, transpose: bool = True) -> Mutation:
    """Expert weights decoded from the fixture's own bytes, optionally the wrong way."""

    def mutate(model):
        m = copy.deepcopy(model)
        packed = load_packed(model)
        with torch.no_grad():
            for name, p in m.named_parameters():
                if is_mxfp4_param(name):
                    w = mxfp4_decode(packed[name + "_blocks"], packed[name + "_scales"], swap_nibbles, scale_bias)
                    w = w.swapaxes(-1, -2) if transpose else w.reshape(p.shape)
                    p.copy_(torch.from_numpy(np.ascontiguousarray(w)))
        return m

    return mutate


def check_mxfp4_decoding(model, tokens, logits):
    """Our numpy decoding == transformers' (from_pretrained and convert_moe_packed_tensors), bit for bit."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    packed = load_packed(model)
    params = dict(model.named_parameters())
    n_neg_zero = n_values = 0
    scale_values = set()
    for name, p in params.items():
        if not is_mxfp4_param(name):
            continue
        blocks, scales = packed[name + "_blocks"], packed[name + "_scales"]
        ours = np.ascontiguousarray(mxfp4_decode(blocks, scales).swapaxes(-1, -2))
        theirs = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales),
                                            dtype=torch.float32).numpy()
        loaded = p.detach().numpy()
        assert ours.shape == loaded.shape == theirs.shape, (ours.shape, loaded.shape)
        assert np.array_equal(ours.view(np.uint32), loaded.view(np.uint32)), name
        assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32)), name
        codes = np.stack([blocks & 15, blocks >> 4])
        n_neg_zero += int((codes == 8).sum())
        n_values += codes.size
        scale_values |= set(np.unique(scales).tolist())
    same = forward_logits(mxfp4_experts()(model), tokens)
    assert np.array_equal(same, logits)
    assert n_neg_zero > 0
    return (f"numpy MXFP4 decoding == from_pretrained(Mxfp4Config(dequantize=True)) == "
            f"convert_moe_packed_tensors, bit for bit ({n_values} values, {n_neg_zero} of them code 8 = -0.0; "
            f"scale bytes {min(scale_values)}..{max(scale_values)}); logits from it identical")


def mxfp4_mutations() -> list[tuple[str, Mutation]]:
    return [
        ("MXFP4 nibbles swapped (high nibble first)", mxfp4_experts(swap_nibbles=True)),
        ("MXFP4 scale bias 128 instead of 127", mxfp4_experts(scale_bias=128)),
        ("MXFP4 blocks used untransposed ([E, out, in] read as [E, in, out])", mxfp4_experts(transpose=False)),
    ]


# --- Gemma ---------------------------------------------------------------------------


GEMMA2_QK_SCALE = 6.0
GEMMA2_FINAL_NORM_OFFSET = 8.0


def gemma2_prepare(model: PreTrainedModel) -> None:
    """Make Gemma2's softcaps bite: larger q/k projections (attention scores past 50) and a larger
    final norm scale (pre-cap logits past 30)."""
    scale_params(**{"q_proj.weight": GEMMA2_QK_SCALE, "k_proj.weight": GEMMA2_QK_SCALE})(model)
    model.model.norm.weight.add_(GEMMA2_FINAL_NORM_OFFSET)


def check_gemma2_softcaps(model, tokens, logits):
    """Report how far past the caps the pre-cap values go (causal positions only)."""
    from transformers.models.gemma2 import modeling_gemma2

    original = modeling_gemma2.eager_attention_forward
    peak = []

    def spy(module, query, key, value, attention_mask, **kw):
        scores = query @ modeling_gemma2.repeat_kv(key, module.num_key_value_groups).transpose(2, 3) * kw["scaling"]
        peak.append(float(scores[(attention_mask == 0).expand_as(scores)].abs().max()))
        return original(module, query, key, value, attention_mask, **kw)

    modeling_gemma2.eager_attention_forward = spy
    try:
        forward_logits(model, tokens)
    finally:
        modeling_gemma2.eager_attention_forward = original
    pre = forward_logits(rebuild_with_config(model, final_logit_softcapping=None), tokens)
    attn_cap, final_cap = model.config.attn_logit_softcapping, model.config.final_logit_softcapping
    assert max(peak) > attn_cap and np.abs(pre).max() > 0.7 * final_cap, (peak, np.abs(pre).max())
    return (f"softcaps bite: pre-cap attention scores reach {max(peak):.1f} (cap {attn_cap}), "
            f"pre-cap logits reach {np.abs(pre).max():.1f} (cap {final_cap}, capped max {np.abs(logits).max():.1f})")


def check_gemma3_ignores_attn_softcap(model, tokens, logits):
    """Gemma3Attention never passes attn_logit_softcapping to the attention function."""
    capped = forward_logits(rebuild_with_config(model, attn_logit_softcapping=1.0), tokens)
    assert np.array_equal(capped, logits)
    return "attn_logit_softcapping is ignored by Gemma3 (setting it to 1.0 leaves the logits bit-identical)"


def gemma_mutations(head_dim: int) -> list[tuple[str, Mutation]]:
    return [
        ("norm (1 + w) computed as w", transform_params(is_norm_weight, lambda w: w - 1.0)),
        ("norm weights zeroed (scale 1)", set_params(is_norm_weight, 0.0)),
        ("embedding not scaled by sqrt(hidden)", set_buffers("embed_scale", 1.0)),
        ("attention scale head_dim^-0.5 instead of query_pre_attn_scalar^-0.5",
         with_config(query_pre_attn_scalar=head_dim)),
    ]


# --- MoE (Mixtral, Qwen3-MoE) ----------------------------------------------------------


def mixtral_router_no_renorm(self, hidden_states):
    """Bug: top-k of the softmax over all experts, not renormalised over the k chosen."""
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    logits = torch.nn.functional.linear(hidden_states, self.weight)
    top, idx = torch.topk(torch.softmax(logits.float(), dim=-1), self.top_k, dim=-1)
    return logits, top, idx


def moe_mutations() -> list[tuple[str, Mutation]]:
    return [
        ("top-1 instead of top-2", with_config(num_experts_per_tok=1)),
        ("expert gate/up swapped", transform_params(lambda s: s.endswith("experts.gate_up_proj"), swap_halves(1))),
    ]


# ---------------------------------------------------------------------------
# Fixtures (one function each)
# ---------------------------------------------------------------------------


@fixture("llama3-rope")
def llama3_rope() -> FixtureSpec:
    # head_dim 16, theta 1e4: wavelengths 2*pi*1e4^(2i/16) = 6.3, 19.9, 62.8, ...
    # With original_max_position_embeddings 16 (low_freq_wavelen 16, high_freq_wavelen 4)
    # the first frequency is smoothed and all others are divided by 8.
    rope = dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0,
                high_freq_factor=4.0, original_max_position_embeddings=16)
    config = make_config(LlamaConfig, num_hidden_layers=3, num_key_value_heads=4, head_dim=16,
                         rms_norm_eps=1e-5, rope_parameters=rope, tie_word_embeddings=False)
    return FixtureSpec(
        description="Llama with llama3 rope scaling (factor 8, low 1, high 4, original_max 16; "
                    "56 positions so most run past 16), 3 layers, MHA, untied lm_head, "
                    "perturbed RMSNorm weights, rms_norm_eps 1e-5; 4.x config spelling "
                    "(rope_theta + rope_scaling{rope_type: llama3}).",
        model_cls=LlamaForCausalLM, config=config, seed=1002, n_tokens=56, config_spelling="4.x",
        mutations=[
            ("rope scaling removed (default rope, same theta)",
             with_config(rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
            ("all norm weights = 1", reset_norms()),
        ],
    )


@fixture("llama-tied-bf16")
def llama_tied_bf16() -> FixtureSpec:
    config = make_config(LlamaConfig, num_key_value_heads=2, rms_norm_eps=1e-5,
                         tie_word_embeddings=True, attention_bias=True, mlp_bias=True,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    return FixtureSpec(
        description="Llama with tied embeddings (no lm_head.weight in the file), attention_bias "
                    "(q/k/v/o biases) and mlp_bias (gate/up/down biases), GQA 4/2, default rope; "
                    "weights stored in bfloat16, reference computed in float32 from the "
                    "bf16-rounded weights; native 5.x config spelling.",
        model_cls=LlamaForCausalLM, config=config, seed=1065, n_tokens=48, weights_dtype="bfloat16",
        mutations=[
            ("all biases zeroed", zero_biases()),
            ("o_proj bias zeroed", zero_biases("o_proj")),
            ("mlp biases zeroed", zero_biases("mlp.")),
            ("all norm weights = 1", reset_norms()),
        ],
    )


@fixture("mistral-window")
def mistral_window() -> FixtureSpec:
    config = make_config(MistralConfig, num_key_value_heads=2, head_dim=16, sliding_window=8,
                         rms_norm_eps=1e-6, tie_word_embeddings=False,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    return FixtureSpec(
        description="Mistral with sliding_window 8 over 40 tokens (eager mask: query i sees keys "
                    "j with i-8 < j <= i, i.e. 8 keys including itself), GQA 4/2, rope_theta 1e6, "
                    "untied; 4.x config spelling (rope_scaling null).",
        model_cls=MistralForCausalLM, config=config, seed=1003, n_tokens=40, config_spelling="4.x",
        mutations=[
            ("no sliding window", with_config(sliding_window=None)),
            ("window 9 (off by one, wider)", with_config(sliding_window=9)),
            ("window 7 (off by one, narrower)", with_config(sliding_window=7)),
            ("rope_theta 1e4 instead of 1e6",
             with_config(rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
        ],
        checks=[check_sliding_window(8)],
    )


@fixture("qwen2-bias")
def qwen2_bias() -> FixtureSpec:
    config = make_config(Qwen2Config, num_key_value_heads=2, rms_norm_eps=1e-6,
                         tie_word_embeddings=True,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    return FixtureSpec(
        description="Qwen2 with q/k/v biases (no o_proj bias), tied embeddings, GQA 4/2, "
                    "rope_theta 1e6; native 5.x config spelling.",
        model_cls=Qwen2ForCausalLM, config=config, seed=1021, n_tokens=52,
        mutations=[
            ("q/k/v biases zeroed", zero_biases()),
            ("k bias only zeroed", zero_biases("k_proj")),
            ("v bias only zeroed", zero_biases("v_proj")),
            ("all norm weights = 1", reset_norms()),
        ],
    )


@fixture("qwen3-qknorm")
def qwen3_qknorm() -> FixtureSpec:
    config = make_config(Qwen3Config, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
                         tie_word_embeddings=False,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    return FixtureSpec(
        description="Qwen3 with per-head q_norm/k_norm (perturbed), head_dim 32 with hidden 64 and "
                    "4 heads (q_proj 64->128, o_proj 128->64), GQA 4/2, rope_theta 1e6, untied; "
                    "4.x config spelling.",
        model_cls=Qwen3ForCausalLM, config=config, seed=1007, n_tokens=60, config_spelling="4.x",
        mutations=[
            ("q/k norm weights = 1", reset_norms("q_norm", "k_norm")),
            ("q/k norm skipped entirely", replace_modules(("self_attn.q_norm", "self_attn.k_norm"))),
            ("all norm weights = 1", reset_norms()),
        ],
    )



@fixture("gpt-oss-bf16")
def gpt_oss_bf16() -> FixtureSpec:
    return FixtureSpec(
        description="gpt-oss (GptOssForCausalLM), unquantized layout as save_pretrained writes it "
                    "(experts.gate_up_proj [E, hidden, 2*width] with gate/up interleaved in even/odd "
                    "columns, experts.down_proj [E, width, hidden], their biases, router weight+bias, "
                    "sinks); 4 layers, layer_types sliding/full/sliding/full with window 8 over 80 "
                    "tokens; 4 experts, top-2; heads 4/2, head_dim 16; YaRN (factor 32, original_max 32, "
                    "beta_fast 32, beta_slow 1, truncate false), rope_theta 150000; swiglu_limit 7 with "
                    "expert weights scaled so the clamp is active; sinks N(0, 1); all biases perturbed. "
                    "Weights stored in bfloat16, reference computed in float32 from the bf16 values; "
                    "native 5.x config spelling.",
        model_cls=GptOssForCausalLM, config=gpt_oss_config(), seed=2054, n_tokens=80,
        weights_dtype="bfloat16", prepare=gpt_oss_prepare, mutations=gpt_oss_mutations(),
        checks=[check_yarn, check_swiglu_clamp, check_sliding_window(8, MOE_TOL, layer_types=all_full(GPT_OSS_LAYERS)),
                check_experts_eager],
    )


@fixture("gpt-oss-mxfp4")
def gpt_oss_mxfp4() -> FixtureSpec:
    n_experts_per_tok = gpt_oss_config().num_experts_per_tok
    return FixtureSpec(
        description="gpt-oss in the released layout: experts as MXFP4 (experts.gate_up_proj_blocks "
                    "uint8 [E, 2*width, hidden/32, 16], _scales uint8 [E, 2*width, hidden/32], "
                    "down_proj_blocks [E, hidden, width/32, 16], down_proj_scales [E, hidden, width/32]), "
                    "everything else bf16 (expert biases, router, attention, sinks, norms, embeddings); "
                    "config with quantization_config {quant_method: mxfp4, modules_to_not_convert} and "
                    "4.x spelling (rope_scaling {rope_type: yarn, ...}, rope_theta 150000 as an integer, "
                    "torch_dtype bfloat16, layer_types kept, experts_per_token/initial_context_length). "
                    "Same random model as gpt-oss-bf16 with its experts quantized; the reference logits "
                    "come from transformers' own decoding of the packed bytes "
                    "(from_pretrained(dir, dtype=float32, quantization_config=Mxfp4Config(dequantize=True))).",
        model_cls=GptOssForCausalLM, config=gpt_oss_config(), seed=2054, n_tokens=80, config_spelling="4.x",
        weights_dtype="bfloat16", prepare=gpt_oss_prepare, writer=write_mxfp4_checkpoint,
        load_kwargs=mxfp4_load_kwargs,
        config_4x=dict(keep=("layer_types",),
                       add={"rope_theta": int(GPT_OSS_ROPE["rope_theta"]), "experts_per_token": n_experts_per_tok,
                            "initial_context_length": GPT_OSS_ROPE["original_max_position_embeddings"]}),
        reference_extra={"expert_weights": "mxfp4"},
        mutations=mxfp4_mutations() + [m for m in gpt_oss_mutations() if m[0] in (
            "sinks ignored (no sink term in the softmax)", "no swiglu clamp",
            "gate/up as halves instead of even/odd columns", "YaRN removed (default rope, theta 150000)",
            "sliding/full phase inverted")],
        checks=[check_mxfp4_decoding, check_swiglu_clamp, check_experts_eager],
    )


@fixture("gemma2")
def gemma2() -> FixtureSpec:
    n = 4
    config = make_config(Gemma2Config, num_hidden_layers=n, num_key_value_heads=2, head_dim=16,
                         query_pre_attn_scalar=24, sliding_window=8, attn_logit_softcapping=50.0,
                         final_logit_softcapping=30.0, hidden_activation="gelu_pytorch_tanh",
                         rms_norm_eps=1e-6, tie_word_embeddings=True,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    return FixtureSpec(
        description="Gemma2 with 4 layers alternating sliding (window 8) / global starting with "
                    "sliding, attn_logit_softcapping 50 and final_logit_softcapping 30 (q/k weights and "
                    "the final norm scaled up so that both caps bite), query_pre_attn_scalar 24 != "
                    "head_dim 16, 4 perturbed (1 + w) RMSNorms per layer, GQA 4/2, gelu_pytorch_tanh, "
                    "tied embeddings scaled by sqrt(64) = 8; 48 tokens; 4.x config spelling "
                    "(no layer_types).",
        model_cls=Gemma2ForCausalLM, config=config, seed=2035, n_tokens=48, config_spelling="4.x",
        prepare=gemma2_prepare,
        mutations=gemma_mutations(head_dim=16) + [
            # Barely visible (1.5e-2 x std) with these weights; Gemma3's fixture cannot see it at all.
            ("gelu (erf) instead of gelu_pytorch_tanh", with_config(hidden_activation="gelu")),
            ("no attention logit softcap", with_config(attn_logit_softcapping=None)),
            ("no final logit softcap", with_config(final_logit_softcapping=None)),
            ("post-attention/post-feedforward norms skipped",
             replace_modules(("post_attention_layernorm", "post_feedforward_layernorm"))),
            ("sliding/global phase inverted",
             with_config(layer_types=alternating("full_attention", "sliding_attention", n))),
            ("no sliding window", with_config(layer_types=all_full(n))),
        ],
        checks=[check_sliding_window(8, layer_types=all_full(n)), check_gemma2_softcaps],
    )


@fixture("gemma3")
def gemma3() -> FixtureSpec:
    n = 6
    local = {"rope_type": "default", "rope_theta": 10000.0}
    glob = {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}
    config = make_config(Gemma3TextConfig, num_hidden_layers=n, num_key_value_heads=1, head_dim=32,
                         intermediate_size=64, query_pre_attn_scalar=48, sliding_window=8,
                         hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6, tie_word_embeddings=True,
                         rope_parameters={"sliding_attention": dict(local), "full_attention": dict(glob)})
    assert config.layer_types == ["sliding_attention"] * 5 + ["full_attention"], config.layer_types
    return FixtureSpec(
        description="Gemma3 text (Gemma3ForCausalLM, gemma3_text) with 6 layers, 5 sliding (window 8) : "
                    "1 global (layer 5); local rope theta 1e4 (rope_local_base_freq), global rope theta "
                    "1e6 with linear scaling factor 8; per-head q_norm/k_norm ((1 + w) RMSNorm over "
                    "head_dim 32); 4 heads, 1 KV head (q_proj 64->128, o_proj 128->64); "
                    "query_pre_attn_scalar 48; no softcaps (as released); tied embeddings scaled by 8; "
                    "48 tokens; 4.x config spelling (rope_theta, rope_local_base_freq, "
                    "rope_scaling {rope_type: linear, factor: 8}, sliding_window_pattern 6, no layer_types).",
        model_cls=Gemma3ForCausalLM, config=config, seed=2027, n_tokens=48, config_spelling="4.x",
        config_4x=dict(add={"sliding_window_pattern": 6}),
        mutations=gemma_mutations(head_dim=32) + [
            ("rope bases swapped (local 1e6, global 1e4)",
             with_config(rope_parameters={"sliding_attention": {**local, "rope_theta": glob["rope_theta"]},
                                          "full_attention": {**glob, "rope_theta": local["rope_theta"]}})),
            ("linear scaling removed from the global layer",
             with_config(rope_parameters={"sliding_attention": dict(local),
                                          "full_attention": {"rope_type": "default", "rope_theta": 1e6}})),
            ("linear scaling also applied to local layers",
             with_config(rope_parameters={"sliding_attention": {**glob, "rope_theta": local["rope_theta"]},
                                          "full_attention": dict(glob)})),
            ("q/k norm skipped", replace_modules(("self_attn.q_norm", "self_attn.k_norm"))),
            ("global layer first instead of last",
             with_config(layer_types=["full_attention"] + ["sliding_attention"] * (n - 1))),
            # Layer type also selects the rope, so "no window" keeps the types and widens the window.
            ("no sliding window", with_config(sliding_window=4096)),
            ("window 9 (off by one, wider)", with_config(sliding_window=9)),
        ],
        checks=[check_sliding_window(8, sliding_window=4096), check_gemma3_ignores_attn_softcap],
    )


@fixture("qwen3-moe")
def qwen3_moe() -> FixtureSpec:
    config = make_config(Qwen3MoeConfig, num_hidden_layers=3, num_key_value_heads=2, head_dim=16,
                         num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, intermediate_size=128,
                         norm_topk_prob=True, mlp_only_layers=[0], rms_norm_eps=1e-6, tie_word_embeddings=False,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    return FixtureSpec(
        description="Qwen3-MoE with 3 layers: layer 0 dense (mlp_only_layers [0], intermediate 128), "
                    "layers 1-2 sparse with 8 experts, top-2, norm_topk_prob true, moe_intermediate_size "
                    "32, router without bias; per-head q/k norms; GQA 4/2, head_dim 16, rope_theta 1e6, "
                    "untied; experts saved per expert (mlp.experts.N.gate_proj/up_proj/down_proj.weight); "
                    "4.x config spelling with num_experts (transformers 5 writes num_local_experts).",
        model_cls=Qwen3MoeForCausalLM, config=config, seed=2054, n_tokens=48, config_spelling="4.x",
        config_4x=dict(renames={"num_local_experts": "num_experts"}),
        mutations=moe_mutations() + [
            ("norm_topk_prob false", with_config(norm_topk_prob=False)),
            ("q/k norm skipped", replace_modules(("self_attn.q_norm", "self_attn.k_norm"))),
            ("all norm weights = 1", reset_norms()),
        ],
        checks=[check_experts_eager],
    )


@fixture("mixtral")
def mixtral() -> FixtureSpec:
    config = make_config(MixtralConfig, num_key_value_heads=2, head_dim=16, intermediate_size=32,
                         num_local_experts=8, num_experts_per_tok=2, sliding_window=8, rms_norm_eps=1e-5,
                         tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    return FixtureSpec(
        description="Mixtral with 8 experts, top-2 (softmax over all 8, top-2 renormalised), "
                    "intermediate 32, sliding_window 8 over 40 tokens (applied by eager transformers "
                    "5.24 through the mask, as for Mistral), GQA 4/2, rope_theta 1e6, untied; experts "
                    "saved as block_sparse_moe.experts.N.w1/w2/w3.weight; native 5.x config spelling.",
        model_cls=MixtralForCausalLM, config=config, seed=2041, n_tokens=40,
        mutations=moe_mutations() + [
            ("top-2 weights not renormalised", patch_modules(MixtralTopKRouter, forward=mixtral_router_no_renorm)),
            ("no sliding window", with_config(sliding_window=None)),
            ("window 9 (off by one, wider)", with_config(sliding_window=9)),
            ("window 7 (off by one, narrower)", with_config(sliding_window=7)),
        ],
        checks=[check_sliding_window(8, MOE_TOL), check_experts_eager],
    )


# ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("tests/fixtures"))
    ap.add_argument("names", nargs="*", help=f"fixtures to build (default: all of {list(FIXTURES)})")
    args = ap.parse_args(argv)

    names = args.names or list(FIXTURES)
    unknown = [n for n in names if n not in FIXTURES]
    if unknown:
        ap.error(f"unknown fixture(s) {unknown}; known: {list(FIXTURES)}")

    torch.set_num_threads(1)  # reproducible reduction order
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, numpy {np.__version__}")
    results = [generate_fixture(n, args.out) for n in names]
    print("\n" + markdown_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
