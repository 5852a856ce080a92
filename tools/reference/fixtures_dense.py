"""The dense fixtures of tools/reference: ``llama3-rope``, ``llama-tied-bf16``, ``mistral-window``,
``qwen2-bias`` and ``qwen3-qknorm`` (one ``@fixture`` function each; see README.md's table).

Only specs live here: building, saving and checking are fixture_lib's.  Changing a seed, a config
value or a description changes the committed files in tests/fixtures.
"""

from __future__ import annotations

from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from checks import check_sliding_window
from fixture_lib import FixtureSpec, fixture, make_config
from mutations import replace_modules, reset_norms, with_config, zero_biases


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
