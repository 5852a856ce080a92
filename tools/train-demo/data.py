"""The demo model's training data: reading the corpus files written by prepare_corpus.py
(``read_docs``, ``read_manifest``), turning documents into one token stream
(``encode_stream``), the seeded epoch order of training windows (``Batches``) and the
evaluation windows (``eval_windows``).

It must not train the tokenizer (tokenizer_train.py) or touch a model; its only randomness is the
numpy generator seeded by the caller, so the data order is reproducible.
"""

import json
import os

import numpy as np
import torch


DOC_SEP = "\n<|endoftext|>\n"


def read_docs(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    docs = [d.strip("\n") for d in text.split(DOC_SEP)]
    return [d for d in docs if d]


def read_manifest(corpus_dir):
    """The corpus' manifest.json (hashes, rustc version) written by prepare_corpus.py; {} if absent."""
    mpath = os.path.join(corpus_dir, "manifest.json")
    if not os.path.exists(mpath):
        return {}
    with open(mpath) as f:
        return json.load(f)


def encode_stream(tok, docs, eot):
    ids = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eot)
    return np.asarray(ids, dtype=np.int64)


class Batches:
    """Epochs over the training stream: each epoch starts at a random offset, cuts the
    stream into windows of seq_len + 1 and visits them in a random order."""

    def __init__(self, stream, seq_len, batch, seed):
        self.stream, self.seq, self.batch = stream, seq_len, batch
        self.rng = np.random.default_rng(seed)
        self.epoch, self.queue = 0, []
        self.windows_per_epoch = (len(stream) - 1) // (seq_len + 1) - 1
        if self.windows_per_epoch < batch:
            raise SystemExit(f"corpus too small: {len(stream)} tokens for batch {batch} x {seq_len}")

    def _refill(self):
        off = int(self.rng.integers(0, self.seq + 1))
        starts = off + (self.seq + 1) * np.arange(self.windows_per_epoch)
        self.queue.extend(self.rng.permutation(starts).tolist())
        self.epoch += 1

    def next(self):
        while len(self.queue) < self.batch:
            self._refill()
        take, self.queue = self.queue[:self.batch], self.queue[self.batch:]
        w = np.stack([self.stream[s:s + self.seq + 1] for s in take])
        return torch.from_numpy(w)


def eval_windows(stream, seq_len):
    """Consecutive windows covering the whole stream (the last one may be shorter)."""
    return [stream[i:i + seq_len + 1] for i in range(0, len(stream) - 1, seq_len)]
