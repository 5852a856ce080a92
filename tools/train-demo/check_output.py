#!/usr/bin/env python3
"""Check a model directory written by train.py with transformers alone (CPU is fine).

    python3 tools/train-demo/check_output.py MODEL_DIR [--corpus DIR] [--windows N]

1. model.safetensors has the released gpt-oss layout (uint8 MXFP4 blocks/scales for the
   experts, bf16 for everything else) and config.json the 4.x spelling;
2. GptOssForCausalLM.from_pretrained(MODEL_DIR) loads it (transformers dequantizes the
   MXFP4 experts on CPU) and, if MODEL_DIR/float-reference exists (train.py --save-float),
   holds exactly those weights and gives the same logits;
3. the validation loss recomputed here matches training_log.json;
4. the tokenizer round-trips the corpus text, keeps special tokens whole, loads with
   AutoTokenizer and renders the chat template;
5. greedy generation runs.
Exits non-zero on any failure.
"""

import argparse
import json
import math
import os
import sys

import numpy as np
import safetensors
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from transformers import AutoTokenizer, GptOssForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
DOC_SEP = "\n<|endoftext|>\n"
FAILS = []


def check(ok, msg):
    print(("ok    " if ok else "FAIL  ") + msg, flush=True)
    if not ok:
        FAILS.append(msg)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--corpus", default=os.path.join(HERE, "corpus"))
    ap.add_argument("--windows", type=int, default=None, help="validation windows to evaluate (default all)")
    args = ap.parse_args()
    d = args.model
    cfg = json.load(open(os.path.join(d, "config.json")))
    tlog = json.load(open(os.path.join(d, "training_log.json")))

    # 1. layout ---------------------------------------------------------------
    for k in ("rope_theta", "rope_scaling", "torch_dtype", "quantization_config", "layer_types",
              "sliding_window", "num_local_experts", "experts_per_token", "initial_context_length"):
        check(k in cfg, f"config.json has {k}")
    check("rope_parameters" not in cfg and "dtype" not in cfg, "config.json uses the 4.x spelling only")
    check(cfg["rope_scaling"].get("rope_type") == "yarn", "rope_scaling.rope_type == yarn")
    E, H, W, L = cfg["num_local_experts"], cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    with safetensors.safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        names = list(f.keys())
        bad = []
        for n in names:
            t = f.get_slice(n)
            dt, shape = t.get_dtype(), t.get_shape()
            if n.endswith("gate_up_proj_blocks"):
                ok = dt == "U8" and shape == [E, 2 * W, H // 32, 16]
            elif n.endswith("gate_up_proj_scales"):
                ok = dt == "U8" and shape == [E, 2 * W, H // 32]
            elif n.endswith("down_proj_blocks"):
                ok = dt == "U8" and shape == [E, H, W // 32, 16]
            elif n.endswith("down_proj_scales"):
                ok = dt == "U8" and shape == [E, H, W // 32]
            else:
                ok = dt == "BF16"
            if not ok:
                bad.append(f"{n} {dt} {shape}")
    check(not bad, f"{len(names)} tensors, experts MXFP4 uint8 [E,out,in/32,16]/[E,out,in/32], rest bf16 {bad[:3]}")
    for i in range(L):
        for suffix in ("gate_up_proj_blocks", "gate_up_proj_scales", "gate_up_proj_bias",
                       "down_proj_blocks", "down_proj_scales", "down_proj_bias"):
            if f"model.layers.{i}.mlp.experts.{suffix}" not in names:
                check(False, f"missing model.layers.{i}.mlp.experts.{suffix}")
    size = os.path.getsize(os.path.join(d, "model.safetensors"))
    check(size <= 25_000_000, f"model.safetensors is {size:,} bytes (<= 25 MB)")

    # 2. load with transformers -------------------------------------------------
    try:
        model = GptOssForCausalLM.from_pretrained(d, dtype=torch.float32)
        how = "plain from_pretrained"
    except Exception as e:  # noqa: BLE001  (older versions want an explicit dequantize)
        from transformers import Mxfp4Config
        print(f"      plain from_pretrained failed ({type(e).__name__}: {e}); retrying with Mxfp4Config(dequantize=True)")
        model = GptOssForCausalLM.from_pretrained(d, dtype=torch.float32,
                                                  quantization_config=Mxfp4Config(dequantize=True))
        how = "Mxfp4Config(dequantize=True)"
    ex = model.model.layers[0].mlp.experts
    # transformers <= 5.17 dequantizes to bf16 whatever the dtype asked; MXFP4 values are
    # exact in bf16, so widening to float32 loses nothing
    check(ex.gate_up_proj.dtype in (torch.float32, torch.bfloat16) and tuple(ex.gate_up_proj.shape) == (E, H, 2 * W),
          f"GptOssForCausalLM.from_pretrained ({how}): experts dequantized to {ex.gate_up_proj.dtype} [E, H, 2W]")
    model = model.float().eval()
    ref_dir = os.path.join(d, "float-reference")
    if os.path.isdir(ref_dir):
        ref = GptOssForCausalLM.from_pretrained(ref_dir, dtype=torch.float32).eval()
        sd, rsd = model.state_dict(), ref.state_dict()
        diffs = [k for k in rsd if not torch.equal(sd[k].float(), rsd[k].float())]
        check(not diffs, f"loaded weights == float reference kept by train.py (differs: {diffs[:3]})")
        x = torch.arange(1, 65).unsqueeze(0) * 37 % (cfg["vocab_size"] - 64)
        with torch.no_grad():
            dl = (model(input_ids=x).logits - ref(input_ids=x).logits).abs().max().item()
        check(dl == 0.0, f"logits == float reference (max diff {dl:.2e})")
        del ref

    # 3. validation loss --------------------------------------------------------
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    eot = tok.token_to_id("<|endoftext|>")
    valid_docs = [x for x in open(os.path.join(args.corpus, "valid.txt"), encoding="utf-8").read().split(DOC_SEP) if x.strip("\n")]
    ids = []
    for enc in tok.encode_batch([x.strip("\n") for x in valid_docs], add_special_tokens=False):
        ids += enc.ids + [eot]
    ids = np.asarray(ids)
    check(len(ids) == tlog["data"]["valid_tokens"], f"validation stream {len(ids):,} tokens as in training_log.json")
    seq = tlog["seq_len"]
    windows = [ids[i:i + seq + 1] for i in range(0, len(ids) - 1, seq)]
    if args.windows:
        windows = windows[: args.windows]
    tot, cnt = 0.0, 0
    with torch.no_grad():
        for w in windows:
            w = torch.from_numpy(w).unsqueeze(0)
            logits = model(input_ids=w[:, :-1]).logits
            tot += F.cross_entropy(logits[0].float(), w[0, 1:], reduction="sum").item()
            cnt += w.shape[1] - 1
    vl = tot / cnt
    if args.windows is None or args.windows >= len(windows) and cnt == tlog["valid_tokens"]:
        check(abs(vl - tlog["valid_loss_mxfp4"]) < 2e-3,
              f"valid loss {vl:.4f} (ppl {math.exp(vl):.2f}) == training_log {tlog['valid_loss_mxfp4']:.4f}")
    else:
        print(f"      valid loss on {len(windows)} windows: {vl:.4f} (ppl {math.exp(vl):.2f}); "
              f"training_log (all windows, MXFP4): {tlog['valid_loss_mxfp4']:.4f}")

    # 4. tokenizer -------------------------------------------------------------
    texts = [x.strip("\n") for x in valid_docs]
    train_docs = open(os.path.join(args.corpus, "train.txt"), encoding="utf-8").read().split(DOC_SEP)
    texts += [x.strip("\n") for x in train_docs[:50]]
    texts += ["héllo wörld — 你好 🦀 \t tabs\r\n and CRLF", "   leading spaces", "fn main() {\n    println!(\"hi\");\n}\n"]
    bad = [t[:40] for t in texts if tok.decode(tok.encode(t, add_special_tokens=False).ids,
                                                skip_special_tokens=False) != t]
    check(not bad, f"tokenizer round-trips {len(texts)} texts ({bad[:2]})")
    names = ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>", "<|start|>",
             "<|end|>", "<|message|>", "<|call|>"]
    sids = [tok.token_to_id(n) for n in names]
    check(all(i is not None for i in sids), f"special tokens present: {dict(zip(names, sids))}")
    s = "<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>Ok<|return|>"
    enc = tok.encode(s, add_special_tokens=False).ids
    check(all(i in enc for i in sids[2:] if i not in (sids[3], sids[8])), "special tokens encode as single ids")
    gen = json.load(open(os.path.join(d, "generation_config.json")))
    check(sorted(gen["eos_token_id"]) == sorted([tok.token_to_id("<|return|>"), eot, tok.token_to_id("<|call|>")]),
          "generation_config eos ids = <|return|>, <|endoftext|>, <|call|>")
    hf = AutoTokenizer.from_pretrained(d)
    sample = texts[0][:2000]
    check(hf(sample, add_special_tokens=False)["input_ids"] == tok.encode(sample, add_special_tokens=False).ids,
          f"AutoTokenizer ({type(hf).__name__}) gives the same ids")
    check(hf.eos_token == "<|return|>" and hf.bos_token == "<|startoftext|>", "tokenizer_config bos/eos")
    msgs = [{"role": "user", "content": "What is a trait?"}]
    rendered = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    check(rendered.endswith("<|start|>assistant") and "<|start|>user<|message|>What is a trait?<|end|>" in rendered,
          "chat template renders Harmony")
    tpl = open(os.path.join(d, "chat_template.jinja")).read()
    check(tpl == json.load(open(os.path.join(d, "tokenizer_config.json")))["chat_template"],
          "chat_template.jinja == tokenizer_config.json chat_template")

    # 5. generation --------------------------------------------------------------
    prompt = "fn main() {"
    x = torch.tensor([tok.encode(prompt, add_special_tokens=False).ids])
    out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=24, do_sample=False)
    text = tok.decode(out[0, x.shape[1]:].tolist())
    print(f"      greedy: {prompt!r} -> {text!r}")
    check(out.shape[1] > x.shape[1], "generate() runs")

    print("\nALL CHECKS PASSED" if not FAILS else f"\n{len(FAILS)} CHECK(S) FAILED")
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
