#!/usr/bin/env python3
"""Build tiny RANDOM Hugging Face models and record transformers' reference outputs.

Every fixture is a small causal LM built with transformers itself (hidden 64,
2-6 layers, vocab 256), initialised from a fixed torch seed, with every norm
weight, every bias and every attention sink perturbed away from its init value
so that an engine that forgets a term (a bias, a norm scale, q/k norm, rope
scaling, a sliding window, a sink, a clamp, a softcap) produces visibly
different logits.  Families: Llama, Mistral, Qwen2, Qwen3, gpt-oss (plain and
MXFP4 experts), Gemma2, Gemma3, Qwen3-MoE, Mixtral.

For fixture ``<name>`` the script writes ``<out>/<name>/``:

* ``config.json``, ``model.safetensors``, ``generation_config.json`` -- the model
  as written by ``save_pretrained(safe_serialization=True)`` (``gpt-oss-mxfp4``:
  written by hand in the released MXFP4 layout, see
  ``fixtures_gpt_oss.write_mxfp4_checkpoint``, and the reference is transformers'
  own loading of those files); for fixtures whose ``config_spelling`` is ``"4.x"``
  config.json is afterwards rewritten into the transformers 4.x spelling
  (top-level ``rope_theta``, ``rope_scaling`` and ``torch_dtype`` instead of
  ``rope_parameters`` and ``dtype``).
* ``logits.npy`` -- float32 logits for every position of the input sequence,
  shape ``[n_tokens, vocab]``, little-endian, C order; one eager-attention
  forward over the whole sequence in float32 under ``torch.no_grad()``.
* ``reference.json`` -- ``tokens``, ``greedy`` (16 greedy ids; EOS ignored),
  ``transformers``, ``torch``, ``description``, ``config_spelling``,
  ``weights_dtype`` (and ``expert_weights: "mxfp4"`` for the MXFP4 fixture).

Each fixture is verified by reloading it from disk with
``AutoModelForCausalLM.from_pretrained`` and comparing logits; the greedy ids
are re-checked against a single teacher-forced forward pass.  For every fixture
the script also prints how much the logits move under a few "mutations" (the
mistakes an engine could make), which is the sensitivity table in README.md.

Usage::

    /opt/refenv/bin/python tools/reference/make_fixtures.py [--out tests/fixtures] [names...]

This file is only the command line: it registers the fixtures (by importing the
``fixtures_*.py`` modules, whose import order is the order of "all") and runs
``fixture_lib.generate_fixture`` for each requested name.  It must not hold a
fixture, a helper or a check.  The other modules: fixture_lib.py (the shared
pipeline), mutations.py, checks.py, mxfp4.py, fixtures_dense.py,
fixtures_gpt_oss.py, fixtures_gemma_moe.py.

Adding a family: write one function decorated with ``@fixture("name")`` in the
``fixtures_*.py`` module of its group (or a new one imported below) that
returns a ``FixtureSpec`` (model class, config, seed, token count, spelling,
weights dtype, a list of mutations and checks, optionally a ``prepare`` hook, a
checkpoint ``writer`` and ``load_kwargs``).  Everything else is shared.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
import transformers

# Importing a family module registers its fixtures; this order is the order of "all".
import fixtures_dense  # noqa: F401
import fixtures_gpt_oss  # noqa: F401
import fixtures_gemma_moe  # noqa: F401
from fixture_lib import FIXTURES, generate_fixture, markdown_table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("tests/fixtures"))
    ap.add_argument("names", nargs="*", help=f"fixtures to build (default: all of {list(FIXTURES)})")
    args = ap.parse_args(argv)

    names = args.names or list(FIXTURES)
    unknown = [n for n in names if n not in FIXTURES]
    if unknown:
        ap.error(f"unknown fixture(s) {unknown}; known: {list(FIXTURES)}")

    torch.set_num_threads(1)  # reproducible reduction order
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, numpy {np.__version__}")
    results = [generate_fixture(n, args.out) for n in names]
    print("\n" + markdown_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
