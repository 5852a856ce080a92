"""The gpt-oss fixtures of tools/reference, ``gpt-oss-bf16`` and ``gpt-oss-mxfp4``, and everything
only they use: the shared gpt-oss config and ``prepare`` hook, the YaRN / swiglu-clamp / MXFP4
checks, the gpt-oss mutations (buggy router, gate, attention forwards), and the hand-written
MXFP4 checkpoint (``write_mxfp4_checkpoint``) in the released layout with its loading kwargs.

The MXFP4 number format itself is mxfp4.py's; the pipeline is fixture_lib's.  Both fixtures must
build the same random model (seed 2054, same config and ``prepare``), which is what makes
``gpt-oss-mxfp4`` the quantized ``gpt-oss-bf16``.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import safetensors.torch
import torch
from transformers import GptOssConfig, GptOssForCausalLM, Mxfp4Config, PreTrainedModel
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention, GptOssExperts, GptOssTopKRouter

from checks import MOE_TOL, check_experts_eager, check_sliding_window, record_calls
from fixture_lib import FixtureSpec, Mutation, all_full, alternating, fixture, forward_logits, make_config
from mutations import (
    interleave_halves,
    patch_modules,
    reset_norms,
    scale_params,
    set_params,
    transform_params,
    with_config,
    zero_biases,
)
from mxfp4 import mxfp4_decode, mxfp4_encode


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


# --- MXFP4 experts, stored as the gpt-oss release stores them ----------------------


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


# ---------------------------------------------------------------------------
# Fixtures (one function each)
# ---------------------------------------------------------------------------


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
