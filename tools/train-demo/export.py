"""Writing the demo model in the released gpt-oss layout: the tensors (``export_tensors``: experts
as MXFP4 blocks/scales checked bit for bit against transformers' decoder, everything else bf16),
``config.json`` in the 4.x spelling, ``generation_config.json``, the tokenizer files and the
chat template, plus the small file helpers train.py uses (``write_json``, ``sha256``).

It only formats and writes what it is given: it must not train, evaluate or choose which step is
exported, and it writes nothing outside the output directory it is handed.  README.md is
model_card.py's; training_log.json is assembled by train.py.
"""

import hashlib
import json
import os
import shutil

import safetensors.torch
import torch
import transformers
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from mxfp4 import mxfp4_pack, mxfp4_quantize
from tokenizer_train import tokenizer_config


NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]


def config_json_4x(config):
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


def write_safetensors(path, tensors):
    """Write the exported tensors (mode 0644); returns the file size in bytes."""
    safetensors.torch.save_file(tensors, path, metadata={"format": "pt"})
    os.chmod(path, 0o644)
    return os.path.getsize(path)


def generation_config(ids):
    """generation_config.json as released: sampling on, three stop ids."""
    return {"bos_token_id": ids["<|startoftext|>"], "do_sample": True,
            "eos_token_id": [ids["<|return|>"], ids["<|endoftext|>"], ids["<|call|>"]],
            "pad_token_id": ids["<|endoftext|>"], "transformers_version": transformers.__version__}


def write_tokenizer_files(out_dir, tok, chat_template_path, max_len):
    """tokenizer.json, chat_template.jinja (a copy of ``chat_template_path``) and tokenizer_config.json."""
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    with open(chat_template_path, encoding="utf-8") as f:
        chat_template = f.read()
    shutil.copyfile(chat_template_path, os.path.join(out_dir, "chat_template.jinja"))
    write_json(os.path.join(out_dir, "tokenizer_config.json"), tokenizer_config(tok, chat_template, max_len))


def write_json(path, obj, indent=2):
    with open(path, "w") as f:
        json.dump(obj, f, indent=indent)
        f.write("\n")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
