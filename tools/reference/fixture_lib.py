"""The shared fixture pipeline of tools/reference (see README.md there): the recipe constants,
``FixtureSpec`` and the ``@fixture`` registry, building and perturbing a tiny random model, its
tokens, forward logits and greedy ids, saving it (float32 or bf16), the 4.x config rewrite, and
``generate_fixture``, which writes one ``<out>/<name>/`` directory and runs the checks common to
every fixture (reload, greedy vs argmax, router gap, sensitivity of every mutation, sizes).

It owns nothing family-specific: it must not import a fixture module or name a model family;
families describe themselves through ``FixtureSpec`` (mutations, checks, ``prepare``, ``writer``,
``load_kwargs``, ``config_4x``) in the ``fixtures_*.py`` modules.
"""

from __future__ import annotations

import copy
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedModel


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


def alternating(first: str, second: str, n: int) -> list[str]:
    return [first if i % 2 == 0 else second for i in range(n)]


def all_full(n: int) -> list[str]:
    return ["full_attention"] * n


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
