"""Reusable weight and config edits for the fixtures of tools/reference: the "mutations" (a
reference model -> a deliberately wrong copy, one per mistake an engine could make, whose logit
change is the sensitivity table in README.md) and the ``scale_params`` ``prepare`` hook (which,
unlike a mutation, edits the freshly built model in place, before it is saved).

A mutation must never modify the model it is given (it works on a copy, or rebuilds with the same
weights); nothing here may name a particular fixture.  Family-specific mutations live with their
family in the ``fixtures_*.py`` modules.
"""

from __future__ import annotations

import copy
import types
from typing import Callable

import torch
from transformers import PreTrainedModel

from fixture_lib import Mutation, is_norm_weight, rebuild_with_config


def set_params(predicate: Callable[[str], bool], value: float) -> Mutation:
    def mutate(model):
        m = copy.deepcopy(model)
        hits = 0
        with torch.no_grad():
            for name, p in m.named_parameters():
                if predicate(name):
                    p.fill_(value)
                    hits += 1
        assert hits, "mutation matched no parameter"
        return m

    return mutate


def zero_biases(*parts: str) -> Mutation:
    """Zero biases whose name contains any of ``parts`` (all biases if none given)."""
    return set_params(lambda n: n.endswith(".bias") and (not parts or any(s in n for s in parts)), 0.0)


def reset_norms(*parts: str) -> Mutation:
    """Set norm weights (whose name contains any of ``parts``, or all) back to 1."""
    return set_params(lambda n: is_norm_weight(n) and (not parts or any(s in n for s in parts)), 1.0)


def with_config(**changes) -> Mutation:
    return lambda model: rebuild_with_config(model, **changes)


def replace_modules(attr_names: tuple[str, ...], factory=torch.nn.Identity) -> Mutation:
    """Replace e.g. self_attn.q_norm in every layer by Identity (term skipped entirely)."""

    def mutate(model):
        m = copy.deepcopy(model)
        for layer in m.model.layers:
            for attr in attr_names:
                owner_path, _, leaf = attr.rpartition(".")
                owner = layer.get_submodule(owner_path) if owner_path else layer
                setattr(owner, leaf, factory())
        return m

    return mutate


def transform_params(predicate: Callable[[str], bool], fn: Callable[[torch.Tensor], torch.Tensor]) -> Mutation:
    """Replace every parameter whose name matches by ``fn(parameter)`` (same shape)."""

    def mutate(model):
        m = copy.deepcopy(model)
        hits = 0
        with torch.no_grad():
            for name, p in m.named_parameters():
                if predicate(name):
                    p.copy_(fn(p.detach().clone()))
                    hits += 1
        assert hits, "mutation matched no parameter"
        return m

    return mutate


def patch_modules(module_cls: type, **methods: Callable) -> Mutation:
    """Override methods (e.g. ``forward``) on every ``module_cls`` instance of a copy of the model."""

    def mutate(model):
        m = copy.deepcopy(model)
        hits = 0
        for module in m.modules():
            if isinstance(module, module_cls):
                for attr, fn in methods.items():
                    setattr(module, attr, types.MethodType(fn, module))
                hits += 1
        assert hits, f"no {module_cls.__name__} in the model"
        return m

    return mutate


def set_buffers(suffix: str, value: float) -> Mutation:
    """Fill every (non-persistent) buffer whose name ends with ``suffix``, e.g. Gemma's embed_scale."""

    def mutate(model):
        m = copy.deepcopy(model)
        hits = [b.fill_(value) for name, b in m.named_buffers() if name.endswith(suffix)]
        assert hits, f"no buffer *{suffix}"
        return m

    return mutate


def swap_halves(dim: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """[a; b] -> [b; a] along ``dim`` (gate/up swapped in a concatenated gate_up_proj)."""
    return lambda t: torch.cat(t.chunk(2, dim=dim)[::-1], dim=dim)


def interleave_halves(t: torch.Tensor) -> torch.Tensor:
    """Last dim [g0..gn, u0..un] -> [g0, u0, g1, u1, ...].  Feeding this to gpt-oss (gate = even columns)
    reproduces an engine that splits gate_up into halves instead of even/odd columns."""
    g, u = t.chunk(2, dim=-1)
    return torch.stack([g, u], dim=-1).flatten(-2)


def scale_params(**factors: float) -> Callable[[PreTrainedModel], None]:
    """A ``prepare`` hook: multiply every parameter whose name ends with ``.<key>`` by the factor."""

    def prepare(model):
        for key, factor in factors.items():
            hits = [p.mul_(factor) for n, p in model.named_parameters() if n.endswith("." + key)]
            assert hits, key

    return prepare
