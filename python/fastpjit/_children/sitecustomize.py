"""Installs fastpjit in the Python processes that `python -m fastpjit run` starts: its workers
(multiprocessing's spawn and forkserver start new interpreters), and other Python programs it
runs. The runner puts this folder first on their PYTHONPATH and sets FASTPJIT_INSTALL=1;
Python's `site` then imports this module at start-up.

It imports nothing heavy: fastpjit installs itself right after the process first imports jax,
before the module that imported it goes on, so that `from jax import jit` binds fastpjit's.
Then the `sitecustomize` that this one hides, if any, runs.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from collections.abc import Sequence


class _InstallAfterJax(importlib.abc.MetaPathFinder):
    """Finds nothing itself: it wraps the loading of `jax`, once."""

    def find_spec(
        self,
        name: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if name != "jax":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            load(module)
            import fastpjit

            fastpjit.install()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]  # this loader only
        return spec


def _hidden_sitecustomize() -> None:
    """Runs the `sitecustomize` module that this one comes before on the path, if any."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


if os.environ.get("FASTPJIT_INSTALL") == "1" and "jax" not in sys.modules:
    sys.meta_path.insert(0, _InstallAfterJax())
_hidden_sitecustomize()
