"""The demo model's README.md (model card): ``model_card`` renders it from the exported config,
the training log and the parameter counts; ``recipe_text`` and ``data_description`` write its
"Training" and "Data" paragraphs.

Text only: it must not compute or measure anything (every number comes from train.py's results);
it reads nothing but the corpus' SOURCES.md and writes no file itself.
"""

import os

import torch
import transformers

from tokenizer_train import N_SPECIAL


def model_card(info):
    c, r, lg = info["config"], info["recipe"], info["log"]
    ppl_line = (f"| bf16 weights | {lg['valid_loss_bf16']:.4f} | {lg['valid_ppl_bf16']:.2f} |\n"
                f"| MXFP4 experts (as shipped) | {lg['valid_loss_mxfp4']:.4f} | {lg['valid_ppl_mxfp4']:.2f} |\n"
                f"| MXFP4, on a training sample of the same size | {lg['train_sample_loss_mxfp4']:.4f} "
                f"| {lg['train_sample_ppl_mxfp4']:.2f} |")
    fence = "`" * 4
    samples = "\n\n".join(f"{fence}text\n{s['prompt']}\u2588{s['completion']}\n{fence}"
                          for s in lg.get("samples", []))
    return f"""# turbospark-demo-gpt-oss

A small language model with the **gpt-oss architecture** (`GptOssForCausalLM`), trained
from scratch on the Rust documentation books, to ship with TurboSpark as a real
(not random) demo model. It writes
Rust-book-flavoured English and Rust code; it is **not** instruction-tuned, knows
nothing beyond those books and is often wrong. Use it to exercise an inference
engine, not for answers.

```sh
turbospark run --model MODEL_DIR --prompt "fn main() {{" --max-tokens 64
```

## Architecture

| | |
|---|---|
| layers | {c['num_hidden_layers']} (alternating sliding-window {c['sliding_window']} / full attention, sliding first) |
| hidden size | {c['hidden_size']} |
| attention | {c['num_attention_heads']} query heads, {c['num_key_value_heads']} KV heads, head_dim {c['head_dim']}, q/k/v/o biases, learned attention sinks |
| MoE | {c['num_local_experts']} experts, top-{c['num_experts_per_tok']}, expert width {c['intermediate_size']}, clamped SwiGLU (limit 7, α 1.702), expert biases |
| RoPE | YaRN, θ {c['rope_theta']}, factor {c['rope_scaling']['factor']}, original context {c['rope_scaling']['original_max_position_embeddings']}, max positions {c['max_position_embeddings']} |
| vocabulary | {c['vocab_size']} (byte-level BPE trained on the corpus + Harmony special tokens) |
| parameters | {info['params']['params_total']:,} total, {info['params']['params_experts']:,} in experts, ~{info['params']['params_active_per_token']:,} active per token (excluding the embedding lookup) |
| file | `model.safetensors`, {info['file_bytes']:,} bytes: experts in MXFP4 (`*_blocks`/`*_scales`, as released gpt-oss), everything else bf16 |

Untied embeddings; RMSNorm ε 1e-5. `config.json` uses the transformers 4.x spelling of the
released gpt-oss checkpoints (`rope_scaling`, `rope_theta`, `torch_dtype`,
`quantization_config: mxfp4`).

## Tokenizer

Byte-level BPE (Hugging Face `tokenizers`) with gpt-oss' o200k pre-tokenisation regex,
{c['vocab_size'] - N_SPECIAL} BPE tokens (256 byte tokens + merges) trained on the training split, then
{N_SPECIAL} special ids at the end: `<|startoftext|>`, `<|endoftext|>`, `<|return|>`,
`<|constrain|>`, `<|channel|>`, `<|start|>`, `<|end|>`, `<|message|>`, `<|call|>`,
`<|endofprompt|>` at the same offsets from the first special id as in o200k_harmony,
the rest `<|reserved_N|>`. Documents were separated by `<|endoftext|>` in training; the
Harmony tokens are in the vocabulary (and the real gpt-oss chat template ships in
`chat_template.jinja`) but the model never saw them in training.

## Data

{info['data_md']}

## Training

{r}

## Results

Validation: the held-out pages (every 20th page in reading order), {lg['valid_tokens']:,} tokens,
windows of {lg['seq_len']} tokens, evaluated with transformers' own forward pass in float32
on the weights as stored. The exported step was chosen on this same validation set (best of
the periodic evaluations), so these figures are slightly optimistic.

| weights | loss (nats/token) | perplexity |
|---|---|---|
{ppl_line}

Greedy samples (MXFP4 weights; the prompt ends at █):

{samples}

## Licence

The model weights and tokenizer are derived from the Rust documentation books, which are
dual-licensed MIT OR Apache-2.0; they are distributed under the same terms
(MIT OR Apache-2.0), like TurboSpark. The chat template is gpt-oss' (Apache-2.0).
"""


def data_description(corpus_dir):
    """The "Data" paragraph: SOURCES.md of the corpus without its title and licence section."""
    data_md = "The Rust Programming Language, Rust by Example and The Rust Reference, as shipped with the Rust toolchain."
    spath = os.path.join(corpus_dir, "SOURCES.md")
    if os.path.exists(spath):
        with open(spath, encoding="utf-8") as f:
            s = f.read()
        data_md = s.split("\n", 1)[1].strip()  # drop the title
        data_md = data_md.split("## Licence")[0].strip()
    return data_md


def recipe_text(args, step, steps_per_epoch, tokens_seen, train_time, device, chosen_step, eval_every):
    """The "Training" paragraph, from the arguments and what the run did."""
    return (
        f"From scratch, seed {args.seed}. AdamW (β 0.9/0.95, weight decay {args.weight_decay} on matrices), "
        f"peak LR {args.lr:g} after {args.warmup_steps} warm-up steps, cosine to {args.min_lr_frac:g}× peak, "
        f"gradient clip {args.grad_clip:g}, batch {args.batch_size} × {args.seq_len} tokens, bf16 autocast "
        f"(float32 master weights), dropout {args.dropout:g} on attention and expert outputs (training only), "
        f"router load-balancing loss × {args.aux_coef:g}. The last {args.qat_frac:.0%} of the steps train through "
        f"MXFP4 fake quantisation of the expert weights (straight-through). {step} steps "
        f"({step / steps_per_epoch:.1f} epochs, {tokens_seen:,} tokens) in {train_time:.0f} s on "
        f"{device}; the exported weights are those of step {chosen_step}, the best validation loss "
        f"(with MXFP4 experts) of the evaluations every {eval_every} steps. Experts quantised to MXFP4 per 32-value "
        f"block (E8M0 scale chosen from two candidates by squared error, E2M1 values rounded to nearest). "
        f"Script: `tools/train-demo/train.py` (torch {torch.__version__}, transformers {transformers.__version__}).")
