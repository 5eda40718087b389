"""The signature log: the signatures of the calls that a fastpjit function cached, which a
record saves (`save_signatures`)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from fastpjit import _core
from fastpjit.warm_start.describe import Unrecordable, describe_call
from fastpjit.warm_start.schema import Signature

__all__ = ["SignatureLog", "log_of"]

R = TypeVar("R")


def _frozen(value: Any) -> Any:
    """A JSON value as a hashable one that compares as its JSON text would (`1`, `1.0` and
    `true` apart), holding its strings rather than copies: a large static argument is not
    kept twice."""
    if isinstance(value, dict):
        return (dict, tuple(sorted((k, _frozen(v)) for k, v in value.items())))
    if isinstance(value, list):
        return (list, tuple(map(_frozen, value)))
    return (type(value), value)


class SignatureLog:
    """The signatures of one function's cache misses, newest last, at most `capacity`; calls
    that a record cannot hold are counted by reason. `dispatch` is the function's dispatch
    cache, which reads a call's signature as it keys it; `statics` are the function's static
    argument positions and names."""

    def __init__(
        self,
        dispatch: _core.DispatchCache,
        statics: tuple[Any, Any] = ((), ()),
        capacity: int = 1024,
    ) -> None:
        self._dispatch = dispatch
        self._static_positions = set(statics[0])
        self._static_names = set(statics[1])
        self._capacity = capacity
        self._signatures: OrderedDict[Any, Signature] = OrderedDict()
        self.unrecordable: dict[str, int] = {}
        self._lock = threading.Lock()

    def noting(
        self, miss: Callable[[tuple[Any, ...], dict[str, Any]], R]
    ) -> Callable[[tuple[Any, ...], dict[str, Any]], R]:
        """`miss`, noting the signature of each call that it serves."""

        def miss_and_note(args: tuple[Any, ...], kwargs: dict[str, Any]) -> R:
            outcome = miss(args, kwargs)
            self.note(args, kwargs)
            return outcome

        return miss_and_note

    def describe(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Signature:
        """The signature of a call of this function; raises `Unrecordable`."""
        return describe_call(self._dispatch, args, dict(kwargs))

    def statics_differ(self, signature: Signature) -> str | None:
        """Where a recorded signature's static arguments are not this function's, which one;
        else None."""
        n = len(signature["args"])
        statics = {p % n for p in self._static_positions if -n <= p < n}
        places = [(f"args[{i}]", arg, i in statics) for i, arg in enumerate(signature["args"])]
        places += [
            (f"kwargs[{k!r}]", arg, k in self._static_names)
            for k, arg in signature["kwargs"].items()
        ]
        for where, arg, static in places:
            recorded = arg.keys() == {"static"}
            if recorded != static:
                kinds = ("static", "dynamic") if recorded else ("dynamic", "static")
                return f"{where} is recorded as {kinds[0]}, and the function takes it as {kinds[1]}"
        return None

    def note(
        self,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        compiler_options: Mapping[str, Any] | None = None,
    ) -> None:
        """Notes the signature of a call, with the compile options of its signature (those
        registered for it, not the function's own), which replace any noted before."""
        try:
            signature = self.describe(args, kwargs)
        except Unrecordable as why:
            self._count(str(why))
            return
        except Exception as error:  # noqa: BLE001 - noting a call never fails it
            self._count(f"{type(error).__name__}: {error}")
            return
        key = _frozen(signature)
        if compiler_options:
            signature["compiler_options"] = dict(compiler_options)
        with self._lock:
            self._signatures[key] = signature
            self._signatures.move_to_end(key)
            while len(self._signatures) > self._capacity:
                self._signatures.popitem(last=False)

    def _count(self, reason: str) -> None:
        with self._lock:
            if reason in self.unrecordable or len(self.unrecordable) < self._capacity:
                self.unrecordable[reason] = self.unrecordable.get(reason, 0) + 1

    def signatures(self) -> list[Signature]:
        with self._lock:
            return list(self._signatures.values())

    def clear(self) -> None:
        with self._lock:
            self._signatures.clear()
            self.unrecordable.clear()


def log_of(fn: Any) -> SignatureLog:
    """The signatures that `fn` served; a bound function's are those of the function that it
    binds, whose calls it makes."""
    log = getattr(fn, "_signature_log", None)
    if not isinstance(log, SignatureLog):
        raise TypeError(
            f"expected a fastpjit function (jit, pjit, pmap, AOT-compiled, "
            f"compile_hlo or bound), got {type(fn).__qualname__}: {fn!r}"
        )
    return log
