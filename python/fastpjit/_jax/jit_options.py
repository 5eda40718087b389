"""What `fastpjit.benchmark` and `fastpjit.explain` read of a jax.jit function: its
own function and options, read back from JAX's private `PjitInfo`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax._src import pjit as _pjit
from jax._src import sharding_impls as _sharding_impls

__all__ = ["is_jax_jit", "jit_function_and_options"]


def is_jax_jit(fn: Any) -> bool:
    """Whether `fn` is a function that jax.jit (or JAX's pjit) returned."""
    return isinstance(getattr(fn, "_jit_info", None), _pjit.PjitInfo)


def jit_function_and_options(jitted: Any) -> tuple[Callable[..., Any], dict[str, Any]]:
    """The function that `jitted` (a jax.jit function) wraps, and jax.jit's keyword arguments
    that make it again."""
    info = jitted._jit_info
    if any(layout is not None for layout in (*info.in_layouts_leaves, *info.out_layouts_leaves)):
        raise ValueError(f"{jitted!r} was jitted with layouts, which fastpjit.jit does not take")
    options: dict[str, Any] = {
        "static_argnums": info.static_argnums,
        "static_argnames": info.static_argnames,
        "donate_argnums": info.donate_argnums,
        "donate_argnames": info.donate_argnames,
        "keep_unused": info.keep_unused,
        "device": info.device,
        "backend": info.backend,
        "inline": info.inline,
        "compiler_options": dict(info.compiler_options_kvs) or None,
    }
    for name, treedef, leaves in (
        ("in_shardings", info.in_shardings_treedef, info.in_shardings_leaves),
        ("out_shardings", info.out_shardings_treedef, info.out_shardings_leaves),
    ):
        if not all(isinstance(leaf, _sharding_impls.UnspecifiedValue) for leaf in leaves):
            options[name] = jax.tree_util.tree_unflatten(treedef, leaves)
    return jitted._fun, options
