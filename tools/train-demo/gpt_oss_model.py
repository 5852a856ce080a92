"""The demo model itself: its ``GptOssConfig`` from the command-line arguments (``build_config``),
construction (``new_model``), parameter and file-size accounting (``param_stats``), the
training-time experts forward (``patch_experts``, same maths as transformers' eager loop, plus
dropout and MXFP4 fake quantisation), and running a model: validation loss (``evaluate``), a model
holding given weights (``model_from_weights``) and greedy samples.

It must not write files or decide the training schedule (train.py does); the patched forward must
stay equal to transformers' ``GptOssForCausalLM`` forward, which train.py checks at start-up.
"""

import types

import numpy as np
import torch
import torch.nn.functional as F
from transformers import GptOssConfig, GptOssForCausalLM

from mxfp4 import mxfp4_fake_quant_xw


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
