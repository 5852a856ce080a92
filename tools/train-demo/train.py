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

This file is the command line and the run: arguments, seeding and determinism
settings, the training loop (schedule, evaluations, best-step selection), the final
evaluation and training_log.json. It must not hold model, tokenizer, data, MXFP4, export
or model-card code; those are gpt_oss_model.py, tokenizer_train.py, data.py,
mxfp4.py, export.py and model_card.py next to it.
"""

import os

# Must be set before CUDA is initialised (deterministic cuBLAS).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

import argparse  # noqa: E402
import copy  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

T_START = time.time()

import numpy as np  # noqa: E402
import safetensors  # noqa: E402
import tokenizers  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402

from data import Batches, encode_stream, eval_windows, read_docs, read_manifest  # noqa: E402
from export import (  # noqa: E402
    config_json_4x,
    export_tensors,
    generation_config,
    sha256,
    write_json,
    write_safetensors,
    write_tokenizer_files,
)
from gpt_oss_model import (  # noqa: E402
    build_config,
    evaluate,
    greedy_samples,
    model_from_weights,
    new_model,
    param_stats,
    patch_experts,
    set_fake_quant,
)
from model_card import data_description, model_card, recipe_text  # noqa: E402
from tokenizer_train import special_tokens, train_tokenizer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def log(*a):
    print(f"[{time.time() - T_START:7.1f}s]", *a, flush=True)


def parse_args():
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
    return ap.parse_args()


def main():
    args = parse_args()
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
    file_bytes = write_safetensors(model_path, tensors)
    log(f"model.safetensors: {file_bytes:,} bytes (estimate {stats['file_bytes_estimate']:,})")

    cfg4 = config_json_4x(config)
    write_json(os.path.join(args.out, "config.json"), cfg4)
    write_json(os.path.join(args.out, "generation_config.json"), generation_config(ids))
    write_tokenizer_files(args.out, tok, args.chat_template, args.max_position_embeddings)

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

    corpus_manifest = read_manifest(args.corpus)
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
    write_json(os.path.join(args.out, "training_log.json"), log_obj, indent=1)

    recipe = recipe_text(args, step, steps_per_epoch, tokens_seen, train_time, log_obj["device"], chosen_step,
                         eval_every)
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write(model_card({"config": cfg4, "recipe": recipe, "log": log_obj, "params": stats,
                            "file_bytes": file_bytes, "data_md": data_description(args.corpus)}))
    log(f"wrote {args.out}: " + ", ".join(sorted(os.listdir(args.out))))


if __name__ == "__main__":
    main()
