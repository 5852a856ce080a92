"""Behaviour checks shared by several fixture families of tools/reference: the eager sliding-window
semantics, transformers' grouped vs eager experts, and ``record_calls`` (capture the inputs of a
module method during one forward pass).  A check is ``fn(model, tokens, logits) -> message`` and
raises ``AssertionError`` when transformers does not behave as README.md says.

Checks only observe: they must not change the model they are given (they run on copies).
Family-specific checks live with their family in the ``fixtures_*.py`` modules.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import PreTrainedModel

from fixture_lib import forward_logits, rebuild_with_config
from mutations import patch_modules


def check_sliding_window(window: int, tol: float = 0.0, **no_window):
    """Assert the eager sliding-window semantics: query i attends to keys i-window < j <= i.

    ``no_window``: the config change that removes the window (default ``sliding_window=None``; models
    with ``layer_types`` use ``layer_types=all_full(n)``).  ``tol``: MoE models group tokens per expert,
    and the grouped GEMMs round a row differently when the other rows change, so "identical" there
    means within ``tol`` (and "differs" means by more than 100 x tol)."""
    no_window = no_window or {"sliding_window": None}
    differs = 100 * tol

    def check(model, tokens, logits):
        full = forward_logits(rebuild_with_config(model, **no_window), tokens)
        wider = forward_logits(rebuild_with_config(model, sliding_window=window + 1), tokens)
        diff = np.abs(full - logits).max(-1)
        assert np.all(diff[:window] <= tol), f"window changes positions < {window}: {diff[:window]}"
        assert np.all(diff[window:] > differs), "sliding window not applied"
        wdiff = np.abs(wider - logits).max(-1)
        # key 0 is dropped first at query `window`
        assert np.all(wdiff[:window] <= tol) and wdiff[window] > differs, wdiff
        same = "identical to" if tol == 0 else f"within {tol:g} of"
        return (f"sliding window applied in eager: positions 0..{window - 1} {same} full causal, "
                f"max|diff| vs no window {diff.max():.4f}; window {window + 1} first differs at "
                f"position {window} => query i sees the {window} keys j with i-{window} < j <= i")

    return check


@torch.no_grad()
def record_calls(model: PreTrainedModel, module_cls: type, method: str, tokens: list[int]) -> list:
    """Run one forward pass on a copy of ``model`` and return the first argument of every call to
    ``module_cls.<method>`` (e.g. the gate_up activations that reach gpt-oss's clamp)."""
    seen = []

    def spy(self, x, *args, **kw):
        seen.append(x.detach().clone())
        return getattr(module_cls, method)(self, x, *args, **kw)

    forward_logits(patch_modules(module_cls, **{method: spy})(model), tokens)
    return seen


MOE_TOL = 1e-5  # see check_sliding_window


def check_experts_eager(model, tokens, logits):
    """transformers' default experts path on CPU is ``grouped_mm``; the loop in modeling_*.py must agree."""
    eager = forward_logits(rebuild_with_config(model, _experts_implementation="eager"), tokens)
    diff = float(np.abs(eager - logits).max())
    assert model.config._experts_implementation == "grouped_mm", model.config._experts_implementation
    assert diff < MOE_TOL, diff
    return f"experts_implementation grouped_mm (default) vs eager loop: max|diff| {diff:.1e}"
