"""The Gemma and classic-MoE fixtures of tools/reference: ``gemma2``, ``gemma3``, ``qwen3-moe`` and
``mixtral``, with what only they use (Gemma2's softcap ``prepare`` hook and checks, the Gemma and
MoE mutation groups, Mixtral's non-renormalising router).

Only specs and their family helpers live here: building, saving and checking are fixture_lib's.
Changing a seed, a config value or a description changes the committed files in tests/fixtures.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    MixtralConfig,
    MixtralForCausalLM,
    PreTrainedModel,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)
from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter

from checks import MOE_TOL, check_experts_eager, check_sliding_window
from fixture_lib import (
    FixtureSpec,
    Mutation,
    all_full,
    alternating,
    fixture,
    forward_logits,
    is_norm_weight,
    make_config,
    rebuild_with_config,
)
from mutations import (
    patch_modules,
    replace_modules,
    reset_norms,
    scale_params,
    set_buffers,
    set_params,
    swap_halves,
    transform_params,
    with_config,
)


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
