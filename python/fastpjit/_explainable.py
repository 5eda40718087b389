"""What `explain` reads of a fastpjit function: the function whose cache would serve a call,
what kind of function it is, and the call probed without running it. Every wrapper provides it
(jit's, pjit's, pmap's, AOT-compiled, compile_hlo's through `Bindable`, and bound functions)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    from fastpjit._core import DispatchCache

__all__ = ["Explainable", "ProbedCall"]


class Explainable(Protocol):
    @property
    def _dispatch_cache(self) -> DispatchCache:
        """The cache that serves its calls, which describes their signatures."""
        ...

    def _explain_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ProbedCall:
        """How `self(*args, **kwargs)` would be served, without running it."""
        ...

    def _compiler_options(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> dict[str, Any] | None:
        """The compile options of `self(*args, **kwargs)`, where the function says."""
        ...


class ProbedCall(NamedTuple):
    """A call probed: `function`, whose cache would serve it (a bound function's function),
    of `kind` ("jit", "pjit", "pmap", "compiled", "compile_hlo", with "bound " before it for a
    bound function), called with `args` and `kwargs` (a bound function's bound arguments
    included); `probe` is the dispatcher's answer (`JitFunction._probe`)."""

    function: Explainable
    kind: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    probe: dict[str, Any]
