#!/usr/bin/env python3
"""Convert a byte-level BPE vocabulary in a GGUF file into a Hugging Face tokenizer.json.

Run with /opt/refenv/bin/python (it has the `gguf` and `tokenizers` packages):

    gguf_to_tokenizer_json.py VOCAB.gguf OUT/tokenizer.json [--check VOCAB.gguf.inp VOCAB.gguf.out]

Why: llama.cpp ships vocabulary-only GGUF files together with test vectors (token ids
for a set of tricky inputs). Converting the vocabulary into the format our Rust
`Tokenizer` reads lets our tests replay those vectors, so the expected ids come from
llama.cpp, not from us.

Only `tokenizer.ggml.model == "gpt2"` (byte-level BPE) is supported; the
pre-tokenizer split regex is chosen from `tokenizer.ggml.pre`, the same way
llama.cpp's llama-vocab.cpp chooses it. Any other model or pre-tokenizer name is
an error rather than a guess.

--check tokenizes every test input with the Python `tokenizers` package and
reports the inputs whose ids differ from the .out file (a quick sanity check; the
Rust test in crates/turbospark-text/tests/vocab.rs is the real one).
"""

import argparse
import json
import re
import sys

import gguf

# The split regexes of the original Hugging Face tokenizers, as llama.cpp names them.
LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# GGUF token types (gguf.TokenType): 1 normal, 2 unknown, 3 control, 4 user defined,
# 5 unused, 6 byte.
TOKEN_NORMAL = 1
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4

# convert_hf_to_gguf.py pads a vocabulary up to the model's embedding size with
# user-defined tokens named [PAD<id>] that the original tokenizer never had.
PAD_FILLER = re.compile(r"^\[PAD\d+\]$")


def byte_level(trim_offsets, use_regex):
    return {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": trim_offsets,
        "use_regex": use_regex,
    }


def pre_tokenizer(regex, trim_offsets):
    """The model's split regex, then bytes to printable characters.

    gpt-2's regex is the ByteLevel pre-tokenizer's built-in one (regex None).
    """
    if regex is None:
        return byte_level(trim_offsets, use_regex=True)
    return {
        "type": "Sequence",
        "pretokenizers": [
            {
                "type": "Split",
                "pattern": {"Regex": regex},
                "behavior": "Isolated",
                "invert": False,
            },
            byte_level(trim_offsets, use_regex=False),
        ],
    }


# pre name -> (normalizer, split regex, trim_offsets, ignore_merges, adds BOS),
# as in the tokenizer.json that each model family publishes.
PRE_TOKENIZERS = {
    "gpt-2": (None, None, True, False, False),
    "llama-bpe": (None, LLAMA3_REGEX, True, True, True),
    "qwen2": ({"type": "NFC"}, QWEN2_REGEX, False, False, False),
}


def field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def convert(path):
    reader = gguf.GGUFReader(path)
    model = field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        sys.exit(f"{path}: tokenizer.ggml.model is {model!r}; only 'gpt2' (byte-level BPE) is supported")
    pre = field(reader, "tokenizer.ggml.pre")
    if pre not in PRE_TOKENIZERS:
        sys.exit(f"{path}: tokenizer.ggml.pre {pre!r} is not one of {sorted(PRE_TOKENIZERS)}")
    normalizer, regex, trim_offsets, ignore_merges, adds_bos = PRE_TOKENIZERS[pre]

    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type")
    merges = field(reader, "tokenizer.ggml.merges")
    bos_id = field(reader, "tokenizer.ggml.bos_token_id")

    # Every token goes into the model vocabulary, added ones too: the tokenizers
    # library gives an added token the id the model has for its text, and only
    # when the model has none does it append one after the vocabulary, ignoring
    # the id in the file. Qwen2's added tokens sit before the [PAD] fillers, so
    # leaving them out of the vocabulary would renumber them.
    vocab = {}
    added = []
    for i, (tok, ty) in enumerate(zip(tokens, types)):
        if ty not in (TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED):
            sys.exit(f"{path}: token {i} {tok!r} has type {ty}, unexpected in a byte-level BPE vocabulary")
        vocab[tok] = i
        # Fillers are not added tokens: their ids still decode, but no merge
        # produces them, so encoding text never does (as in the original).
        if ty == TOKEN_CONTROL or (ty == TOKEN_USER_DEFINED and not PAD_FILLER.match(tok)):
            added.append(
                {
                    "id": i,
                    "content": tok,
                    "single_word": False,
                    "lstrip": False,
                    "rstrip": False,
                    "normalized": False,
                    "special": ty == TOKEN_CONTROL,
                }
            )

    post_processor = byte_level(trim_offsets, use_regex=True)
    if adds_bos:
        bos = tokens[bos_id]
        post_processor = {
            "type": "Sequence",
            "processors": [
                post_processor,
                {
                    "type": "TemplateProcessing",
                    "single": [
                        {"SpecialToken": {"id": bos, "type_id": 0}},
                        {"Sequence": {"id": "A", "type_id": 0}},
                    ],
                    "pair": [
                        {"SpecialToken": {"id": bos, "type_id": 0}},
                        {"Sequence": {"id": "A", "type_id": 0}},
                        {"SpecialToken": {"id": bos, "type_id": 1}},
                        {"Sequence": {"id": "B", "type_id": 1}},
                    ],
                    "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
                },
            ],
        }

    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer(regex, trim_offsets),
        "post_processor": post_processor,
        "decoder": byte_level(True, use_regex=True),
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": ignore_merges,
            "vocab": vocab,
            "merges": list(merges),
        },
    }


def read_vectors(inp_path, out_path):
    # Same parsing as llama.cpp's tests/test-tokenizer-0.cpp.
    with open(inp_path, encoding="utf-8", newline="") as f:
        raw = f.read()
    inputs = raw.split("\n__ggml_vocab_test__\n")
    if inputs and inputs[-1] == "":
        inputs.pop()
    with open(out_path, encoding="utf-8") as f:
        outputs = [[int(t) for t in line.split()] for line in f.read().split("\n")]
    return inputs, outputs[: len(inputs)]


def check(tokenizer_json, inp_path, out_path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(json.dumps(tokenizer_json))
    for t in tokenizer_json["added_tokens"]:
        if tok.token_to_id(t["content"]) != t["id"]:
            print(f"added token {t['content']!r} got id {tok.token_to_id(t['content'])}, not {t['id']}")
            return False
    inputs, outputs = read_vectors(inp_path, out_path)
    bad = 0
    for text, want in zip(inputs, outputs):
        got = tok.encode(text, add_special_tokens=False).ids
        if got != want:
            bad += 1
            print(f"MISMATCH {text!r}: got {got}, llama.cpp {want}")
    print(f"{inp_path}: {len(inputs) - bad}/{len(inputs)} inputs match")
    return bad == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf")
    ap.add_argument("out")
    ap.add_argument("--check", nargs=2, metavar=("INP", "OUT"))
    args = ap.parse_args()
    tokenizer_json = convert(args.gguf)
    with open(args.out, "w", encoding="utf-8") as f:
        # Compact and non-ASCII as is: the files are committed, size matters.
        json.dump(tokenizer_json, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    if args.check and not check(tokenizer_json, *args.check):
        sys.exit(1)


if __name__ == "__main__":
    main()
