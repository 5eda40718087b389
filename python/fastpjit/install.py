"""fastpjit under code that you don't own: `install()` puts fastpjit's jit, pmap and pjit where
programs and libraries look JAX's up (`jax.jit`, `jax.pmap`, `jax.experimental.pjit.pjit`), and
`uninstall()` puts JAX's back.

Code that looks the name up when it runs (`jax.jit(f)`, flax's `nnx.jit`, optax) goes through
fastpjit from then on. Code that bound the name when it was imported (`from jax import jit`)
keeps what it bound: install before importing it, or run the program with
`python -m fastpjit run`, which installs before the program starts.
"""

from __future__ import annotations

import importlib
from types import ModuleType, TracebackType
from typing import Any

from fastpjit._switch import Switch

__all__ = ["Installed", "install", "installed", "uninstall"]

# Where JAX's functions are looked up, and fastpjit's function for each.
_SITES = (("jax", "jit", "jit"), ("jax", "pmap", "pmap"), ("jax.experimental.pjit", "pjit", "pjit"))
# A name that its module serves through its `__getattr__` (a deprecated one), not its dict.
_MISSING: Any = object()

# While installed: each site's module, name and original value.
_originals: list[tuple[ModuleType, str, Any]] | None = None


def _substitute(on: bool) -> None:
    """Puts fastpjit's functions in JAX's place (`on`), or JAX's back."""
    global _originals
    if on:
        from fastpjit.jit import jit, pjit
        from fastpjit.pmap import pmap

        ours = {"jit": jit, "pmap": pmap, "pjit": pjit}
        originals = []
        for module_name, name, our_name in _SITES:
            module = importlib.import_module(module_name)
            originals.append((module, name, vars(module).get(name, _MISSING)))
            setattr(module, name, ours[our_name])
        _originals = originals
        return
    for module, name, original in _originals or ():
        if original is _MISSING:
            vars(module).pop(name, None)
        else:
            setattr(module, name, original)
    _originals = None


_SWITCH = Switch(_substitute)


class Installed:
    """What `install()` returns: as a context manager, it keeps fastpjit installed for the
    block. It stays installed while any such block is open, in any thread; after the last, it
    is as plain `install()` and `uninstall()` calls left it."""

    def __init__(self, installed_before: bool):
        self._installed_before = installed_before

    def __enter__(self) -> Installed:
        _SWITCH.hold(True, self._installed_before)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        _SWITCH.release(True)


def install() -> Installed:
    """Substitutes fastpjit.jit, pmap and pjit for jax.jit, jax.pmap and
    jax.experimental.pjit.pjit. Installing twice changes nothing; `with fastpjit.install():`
    keeps it installed for the block only (unless installed outside it)."""
    return Installed(_SWITCH.set(True))


def uninstall() -> None:
    """Puts JAX's jit, pmap and pjit back where `install()` substituted them, once no
    `with fastpjit.install():` block is open."""
    _SWITCH.set(False)


def installed() -> bool:
    """Whether fastpjit is installed in JAX's place."""
    return _SWITCH.is_on()
