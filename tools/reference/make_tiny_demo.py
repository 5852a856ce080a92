"""Builds `models/tiny-random-gpt2vocab`: the placeholder model the README's
quick start runs until the trained demo model lands.

A tiny RANDOM Llama-architecture model (hidden 64, 2 layers, tied embeddings,
bf16) paired with GPT-2's real byte-level BPE tokenizer (converted from
llama.cpp's vocabulary by tools/vocab/gguf_to_tokenizer_json.py). The text it
writes is gibberish by construction; what it proves is that a fresh clone can
tokenize, run, sample and detokenize end to end.

Run: /opt/refenv/bin/python tools/reference/make_tiny_demo.py
"""

import json
import shutil
from pathlib import Path

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "models" / "tiny-random-gpt2vocab"
TOKENIZER = ROOT / "crates" / "turbospark-text" / "testdata" / "vocab" / "gpt-2" / "tokenizer.json"
EOS = 50256  # <|endoftext|>


def main() -> None:
    torch.manual_seed(2)
    config = LlamaConfig(
        vocab_size=50257,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=EOS,
        eos_token_id=EOS,
        initializer_range=0.1,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(bos_token_id=EOS, eos_token_id=EOS)
    OUT.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(OUT, safe_serialization=True)
    shutil.copy(TOKENIZER, OUT / "tokenizer.json")
    (OUT / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}, indent=2) + "\n"
    )
    (OUT / "README.md").write_text(
        "# tiny-random-gpt2vocab\n\n"
        "Random weights (Llama architecture, hidden 64, 2 layers, tied, bf16) with GPT-2's\n"
        "tokenizer. Made by `tools/reference/make_tiny_demo.py` (seed 2). It exists so the\n"
        "quick start works on a fresh clone; its output is meaningless by construction.\n"
    )
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
