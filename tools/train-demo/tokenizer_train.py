"""The demo model's tokenizer: byte-level BPE with gpt-oss' o200k pre-tokenisation regex, trained
on the training split, followed by ``N_SPECIAL`` special ids at the same offsets as in
o200k_harmony (``special_tokens``), and the ``tokenizer_config.json`` content that goes with it.

It only builds and describes the tokenizer: it must not write files (export.py does) nor read the
corpus (data.py does).  Changing anything here changes tokenizer.json and the model's vocabulary.
"""

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers


# o200k's pre-tokenisation regex, as in gpt-oss' own tokenizer.json.
O200K_PATTERN = "|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])

# The special tokens occupy the last N_SPECIAL ids, at the same offsets from the first
# special id as in gpt-oss' o200k_harmony (199998 + offset); the other slots are
# <|reserved_ID|>.
N_SPECIAL = 32
SPECIAL_OFFSETS = {
    "<|startoftext|>": 0,   # 199998
    "<|endoftext|>": 1,     # 199999
    "<|return|>": 4,        # 200002
    "<|constrain|>": 5,     # 200003
    "<|channel|>": 7,       # 200005
    "<|start|>": 8,         # 200006
    "<|end|>": 9,           # 200007
    "<|message|>": 10,      # 200008
    "<|call|>": 14,         # 200012
    "<|endofprompt|>": 20,  # 200018
}


def special_tokens(vocab_size):
    first = vocab_size - N_SPECIAL
    names = {off: name for name, off in SPECIAL_OFFSETS.items()}
    return [(first + i, names.get(i, f"<|reserved_{first + i}|>")) for i in range(N_SPECIAL)]


def train_tokenizer(train_docs, vocab_size):
    n_bpe = vocab_size - N_SPECIAL
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(O200K_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=n_bpe, min_frequency=2, show_progress=False, special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(train_docs, trainer=trainer)
    got = tok.get_vocab_size()
    if got != n_bpe:
        raise SystemExit(f"BPE training gave {got} tokens, wanted {n_bpe} (corpus too small?)")
    specials = special_tokens(vocab_size)
    tok.add_special_tokens([AddedToken(name, special=True, normalized=False) for _, name in specials])
    for tid, name in specials:
        assert tok.token_to_id(name) == tid, (name, tok.token_to_id(name), tid)
    assert tok.get_vocab_size() == vocab_size
    return tok


def tokenizer_config(tok, chat_template, max_len):
    added = {}
    for tid, name in special_tokens(tok.get_vocab_size()):
        added[str(tid)] = {"content": name, "lstrip": False, "normalized": False, "rstrip": False,
                           "single_word": False, "special": True}
    return {
        "added_tokens_decoder": added,
        "bos_token": "<|startoftext|>",
        "chat_template": chat_template,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|return|>",
        "extra_special_tokens": {},
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": max_len,
        "pad_token": "<|endoftext|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
