"""transformers' perplexity of a text file, computed exactly as
`turbospark perplexity` defines it, so the two can be compared.

The text is tokenized with the model's tokenizer.json (no special tokens
added), cut into consecutive non-overlapping windows of `--context` tokens
(a last window shorter than 2 tokens is dropped), each window is run as a
fresh sequence, and every token after a window's first is scored by the
log-softmax of the previous position's float32 logits. Prints one JSON line.

    /opt/refenv/bin/python tools/train-demo/perplexity_reference.py \
        models/rust-docs-gpt-oss tools/train-demo/corpus/valid.txt --context 512
"""

import argparse
import json
import math

import torch
import transformers
from tokenizers import Tokenizer
from transformers import GptOssForCausalLM, Mxfp4Config


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("text_file")
    ap.add_argument("--context", type=int, default=512)
    a = ap.parse_args()
    torch.manual_seed(0)
    tok = Tokenizer.from_file(f"{a.model}/tokenizer.json")
    with open(a.text_file, encoding="utf-8") as f:
        ids = tok.encode(f.read(), add_special_tokens=False).ids
    # MXFP4 experts are decoded by transformers itself (on a CPU it needs
    # dequantize=True); the model runs in float32 with eager attention.
    model = GptOssForCausalLM.from_pretrained(
        a.model,
        quantization_config=Mxfp4Config(dequantize=True),
        dtype=torch.float32,
        attn_implementation="eager",
    ).eval()
    nll, scored, windows = 0.0, 0, 0
    with torch.no_grad():
        for start in range(0, len(ids), a.context):
            window = ids[start : start + a.context]
            if len(window) < 2:
                continue
            logits = model(torch.tensor([window])).logits[0].double()
            logp = torch.log_softmax(logits[:-1], dim=-1)
            target = torch.tensor(window[1:])
            nll -= logp[torch.arange(len(window) - 1), target].sum().item()
            scored += len(window) - 1
            windows += 1
    print(json.dumps({
        "perplexity": math.exp(nll / scored), "nll": nll / scored, "scored_tokens": scored,
        "total_tokens": len(ids), "windows": windows, "context": a.context,
        "transformers": transformers.__version__, "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
