#!/usr/bin/env python3
"""Build tiny RANDOM Hugging Face models and record transformers' reference outputs.

Every fixture is a small causal LM built with transformers itself (hidden 64,
2-3 layers, vocab 256), initialised from a fixed torch seed, with every norm
weight and every bias perturbed away from its init value so that an engine that
forgets a term (a bias, a norm scale, q/k norm, rope scaling, a sliding window)
produces visibly different logits.

For fixture ``<name>`` the script writes ``<out>/<name>/``:

* ``config.json``, ``model.safetensors``, ``generation_config.json`` -- the model
  as written by ``save_pretrained(safe_serialization=True)``; for fixtures whose
  ``config_spelling`` is ``"4.x"`` config.json is afterwards rewritten into the
  transformers 4.x spelling (top-level ``rope_theta``, ``rope_scaling`` and
  ``torch_dtype`` instead of ``rope_parameters`` and ``dtype``).
* ``logits.npy`` -- float32 logits for every position of the input sequence,
  shape ``[n_tokens, vocab]``, little-endian, C order; one eager-attention
  forward over the whole sequence in float32 under ``torch.no_grad()``.
* ``reference.json`` -- ``tokens``, ``greedy`` (16 greedy ids; EOS ignored),
  ``transformers``, ``torch``, ``description``, ``config_spelling``,
  ``weights_dtype``.

Each fixture is verified by reloading it from disk with
``AutoModelForCausalLM.from_pretrained`` and comparing logits; the greedy ids
are re-checked against a single teacher-forced forward pass.  For every fixture
the script also prints how much the logits move under a few "mutations" (the
mistakes an engine could make), which is the sensitivity table in README.md.

Usage::

    /opt/refenv/bin/python tools/reference/make_fixtures.py [--out tests/fixtures] [names...]

Adding a family: write one function decorated with ``@fixture("name")`` that
returns a ``FixtureSpec`` (model class, config, seed, token count, spelling,
weights dtype and a list of mutations).  Everything else is shared.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import transformers
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

# ---------------------------------------------------------------------------
# Shared recipe
# ---------------------------------------------------------------------------

VOCAB = 256
GREEDY_TOKENS = 16
NORM_PERTURB = 0.3  # norm weight += 0.3 * N(0, 1)  (1 + 0.3 N for ones-initialised norms)
BIAS_PERTURB = 0.2  # bias += 0.2 * N(0, 1)
RELOAD_TOL = 1e-5
MIN_SENSITIVITY = 1e-2  # required max|d logits| / std(logits) for every mutation

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
            elif name.endswith(".bias"):
                p.add_(BIAS_PERTURB * torch.randn_like(p))


def build_model(spec: FixtureSpec) -> PreTrainedModel:
    torch.manual_seed(spec.seed)
    config = copy.deepcopy(spec.config)
    config._attn_implementation = "eager"
    model = spec.model_cls(config).to(torch.float32).eval()
    perturb_(model)
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


# --- behaviour checks ---------------------------------------------------------


def check_sliding_window(window: int):
    """Assert the eager sliding-window semantics: query i attends to keys i-window < j <= i."""

    def check(model, tokens, logits):
        full = forward_logits(rebuild_with_config(model, sliding_window=None), tokens)
        wider = forward_logits(rebuild_with_config(model, sliding_window=window + 1), tokens)
        diff = np.abs(full - logits).max(-1)
        assert np.all(diff[:window] == 0), f"window changes positions < {window}: {diff[:window]}"
        assert np.all(diff[window:] > 0), "sliding window not applied"
        wdiff = np.abs(wider - logits).max(-1)
        assert np.all(wdiff[:window] == 0) and wdiff[window] > 0, wdiff  # key 0 dropped first at query `window`
        return (f"sliding window applied in eager: positions 0..{window - 1} identical to full causal, "
                f"max|diff| vs no window {diff.max():.4f}; window {window + 1} first differs at "
                f"position {window} => query i sees the {window} keys j with i-{window} < j <= i")

    return check


# ---------------------------------------------------------------------------
# Config spelling
# ---------------------------------------------------------------------------


def rewrite_config_4x(path: Path) -> dict:
    """Rewrite a 5.x config.json into the spelling of real (4.x-era) checkpoints."""
    cfg = json.loads(path.read_text())
    out = {}
    for k, v in cfg.items():
        if k == "dtype":
            out["torch_dtype"] = v
        elif k == "rope_parameters":
            rp = dict(v)
            out["rope_theta"] = rp.pop("rope_theta")
            out["rope_scaling"] = None if rp.get("rope_type", "default") == "default" and len(rp) <= 1 else rp
        elif k == "layer_types":
            continue  # 4.x-era checkpoints don't carry it; transformers re-derives it
        else:
            out[k] = v
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


def apply_spelling(d: Path, spelling: str, tokens: list[int]) -> None:
    """For "4.x": rewrite config.json and assert transformers loads it to the identical model."""
    if spelling == "5.x":
        return
    if spelling != "4.x":
        raise ValueError(spelling)
    before = load_from_disk(d, dtype=torch.float32)
    rewrite_config_4x(d / "config.json")
    after = load_from_disk(d)  # no dtype: exactly as a user would load it
    assert after.dtype == torch.float32, after.dtype
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
    save_model(model, d, spec.weights_dtype)
    logits = forward_logits(model, tokens)
    greedy_ids = greedy(model, tokens)
    margin = check_greedy(model, tokens, logits, greedy_ids)
    apply_spelling(d, spec.config_spelling, tokens)

    reloaded = load_from_disk(d, dtype=torch.float32)
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
    for note in notes:
        print(f"   check: {note}")
    for label, diff, rel in rows:
        print(f"   mutation {label!r}: max|dlogit| {diff:.4f} ({rel:.3f} x std)")
    bad = [label for label, _, rel in rows if rel <= MIN_SENSITIVITY]
    assert not bad, f"{name}: insensitive to {bad}"
    assert (d / "model.safetensors").stat().st_size < 1 << 20, "model over 1 MB"
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
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, numpy {np.__version__}")
    results = [generate_fixture(n, args.out) for n in names]
    print("\n" + markdown_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
