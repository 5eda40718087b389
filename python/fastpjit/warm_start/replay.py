"""Replaying a record (`warm_up`): each recorded signature compiled again by one call on
zero-filled arguments rebuilt on this process's devices, so that the first real call of that
signature is a cache hit."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax
import numpy as np

from fastpjit._jax import api
from fastpjit._jax.xla_compile import thread_compile_events
from fastpjit.bind import Bound
from fastpjit.warm_start.log import log_of
from fastpjit.warm_start.record import load_record
from fastpjit.warm_start.schema import Signature, named_type, versions

__all__ = ["MAX_BYTES", "MAX_SIGNATURES", "Skipped", "WarmUpEntry", "WarmUpReport", "warm_up"]

# `warm_up`'s defaults: the most bytes of arguments that one replayed call builds (its zeros on
# the host and its arrays on the devices), and the most signatures replayed per function
# (`save_signatures` writes at most as many).
MAX_BYTES = 2 << 30
MAX_SIGNATURES = 1024


class Skipped(Exception):
    """A recorded signature that this process cannot rebuild, with the reason."""


class _Rebuilder:
    """Rebuilds a recorded call's arguments, zero-filled, on this process's devices; or, where
    `abstract`, its arrays as `jax.ShapeDtypeStruct`s (a signature's shape bucket), placing
    nothing."""

    def __init__(self, abstract: bool = False) -> None:
        self.devices = {d.id: d for d in jax.devices()}
        self.abstract = abstract

    def device(self, device_id: int) -> jax.Device:
        device = self.devices.get(device_id)
        if device is None:
            raise Skipped(
                f"device id {device_id} is not one of this process's {len(self.devices)} devices"
            )
        return device

    def static(self, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        if "tuple" in value:
            return tuple(self.static(v) for v in value["tuple"])
        if "list" in value:
            return [self.static(v) for v in value["list"]]
        dtype = np.dtype(jax.numpy.dtype(value["dtype"]))
        if value["of"] == "numpy.dtype":
            return dtype
        if value["of"] == "numpy":
            return dtype.type
        return getattr(jax.numpy, dtype.name)

    def mesh(self, mesh: dict[str, Any]) -> jax.sharding.Mesh:
        devices = np.array([self.device(i) for i in mesh["device_ids"]], dtype=object)
        axis_types = tuple(jax.sharding.AxisType[t] for t in mesh["axis_types"])
        try:
            return jax.sharding.Mesh(
                devices.reshape(mesh["mesh_shape"]),
                tuple(mesh["axis_names"]),
                axis_types=axis_types,
            )
        except Exception as error:
            raise Skipped(f"the mesh no longer fits: {type(error).__name__}: {error}") from None

    def sharding(self, sharding: dict[str, Any]) -> jax.sharding.Sharding:
        if sharding["type"] == "single":
            return jax.sharding.SingleDeviceSharding(
                self.device(sharding["device_id"]), memory_kind=sharding["memory_kind"]
            )
        mesh = self.mesh(sharding)
        spec = jax.sharding.PartitionSpec(
            *(tuple(p) if isinstance(p, list) else p for p in sharding["spec"])
        )
        return jax.sharding.NamedSharding(mesh, spec, memory_kind=sharding["memory_kind"])

    def leaf(self, leaf: dict[str, Any]) -> Any:
        kind = leaf["kind"]
        if kind in ("bool", "int", "float", "complex"):
            return {"bool": False, "int": 0, "float": 0.0, "complex": 0j}[kind]
        dtype = np.dtype(jax.numpy.dtype(leaf["dtype"]))
        if kind == "numpy_scalar":
            return dtype.type(0)
        if self.abstract:
            return jax.ShapeDtypeStruct(tuple(leaf["shape"]), dtype)
        zeros = np.zeros(leaf["shape"], dtype)
        if kind == "numpy":
            return zeros
        try:
            sharding = self.sharding(leaf["sharding"])
            array = api.weak_typed(zeros) if leaf["weak_type"] else zeros
            if not leaf["committed"]:
                return jax.device_put(array)
            return jax.device_put(array, sharding)
        except Skipped:
            raise
        except Exception as error:  # a mesh or spec that no longer fits this process
            raise Skipped(f"the sharding no longer fits: {type(error).__name__}: {error}") from None

    def node(self, node: dict[str, Any]) -> Any:
        ((tag, value),) = node.items()
        if tag == "none":
            return None
        if tag == "tuple":
            return tuple(self.node(v) for v in value)
        if tag == "list":
            return [self.node(v) for v in value]
        if tag == "dict":
            return {self.static(k): self.node(v) for k, v in value}
        if tag == "namedtuple":
            return self.named_tuple(value)
        return self.leaf(value)

    def named_tuple(self, node: dict[str, Any]) -> Any:
        name, fields = node["type"], tuple(node["fields"])
        kind = named_type(name)
        if kind is None:
            raise Skipped(
                f"the NamedTuple {name} is not found in the modules this process imported"
            )
        if not (isinstance(kind, type) and issubclass(kind, tuple)) or (
            getattr(kind, "_fields", None) != fields
        ):
            raise Skipped(f"{name} is no longer a NamedTuple of the fields {list(fields)}")
        return kind(*(self.node(v) for v in node["children"]))

    def argument(self, arg: dict[str, Any]) -> Any:
        if arg.keys() == {"static"}:
            return self.static(arg["static"])
        return self.node(arg)

    def call(self, signature: Signature) -> tuple[tuple[Any, ...], dict[str, Any]]:
        args = tuple(self.argument(a) for a in signature["args"])
        kwargs = {k: self.argument(v) for k, v in signature["kwargs"].items()}
        return args, kwargs


def _leaf_bytes(leaf: dict[str, Any]) -> int:
    """The bytes that a replay builds for a recorded leaf: an array's on each of its devices."""
    if "dtype" not in leaf:
        return 8  # a Python scalar
    size: int = math.prod(leaf.get("shape", ())) * jax.numpy.dtype(leaf["dtype"]).itemsize
    sharding = leaf.get("sharding")
    if not leaf.get("committed") or sharding is None or sharding["type"] == "single":
        return size
    # Split over the mesh axes that the spec names, and repeated over the others.
    axes = dict(zip(sharding["axis_names"], sharding["mesh_shape"], strict=True))
    named = [e if isinstance(e, list) else [e] for e in sharding["spec"] if e is not None]
    split: int = math.prod(axes.get(axis, 1) for entry in named for axis in entry)
    return -(-size // split) * len(sharding["device_ids"])


def _bytes(node: Any) -> int:
    """The bytes of the arguments that a replay builds for a recorded argument or node."""
    ((tag, value),) = node.items()
    if tag == "leaf":
        return _leaf_bytes(value)
    if tag in ("tuple", "list"):
        return sum(map(_bytes, value))
    if tag == "dict":
        return sum(_bytes(v) for _, v in value)
    if tag == "namedtuple":
        return sum(map(_bytes, value["children"]))
    return 0  # none, static


def _signature_bytes(signature: Signature) -> int:
    return sum(map(_bytes, signature["args"])) + sum(map(_bytes, signature["kwargs"].values()))


@dataclasses.dataclass(frozen=True)
class WarmUpEntry:
    """One recorded signature replayed: compiled, loaded from JAX's persistent compilation
    cache, already cached, or skipped and why."""

    function: str
    index: int
    outcome: str
    seconds: float
    reason: str | None = None


@dataclasses.dataclass(frozen=True)
class WarmUpReport:
    """What `warm_up` did with each recorded signature."""

    entries: tuple[WarmUpEntry, ...]
    seconds: float

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for entry in self.entries:
            out[entry.outcome] = out.get(entry.outcome, 0) + 1
        return out

    def skipped(self) -> dict[str, int]:
        """The reasons of the skipped signatures, with their counts."""
        out: dict[str, int] = {}
        for entry in self.entries:
            if entry.outcome == "skipped":
                assert entry.reason is not None
                out[entry.reason] = out.get(entry.reason, 0) + 1
        return out

    def __str__(self) -> str:
        lines = [
            f"warm_up: {len(self.entries)} signatures in {self.seconds:.2f} s: "
            + ", ".join(f"{n} {outcome}" for outcome, n in sorted(self.counts().items()))
        ]
        for entry in self.entries:
            line = f"  {entry.function}[{entry.index}]: {entry.outcome}, {entry.seconds:.3f} s"
            if entry.reason:
                line += f" ({entry.reason})"
            lines.append(line)
        return "\n".join(lines)


def warm_up(
    path: str | os.PathLike[str],
    functions: Mapping[str, Any],
    *,
    threads: int | None = None,
    max_bytes: int | None = MAX_BYTES,
    max_signatures: int | None = MAX_SIGNATURES,
) -> WarmUpReport:
    """Compiles every signature recorded in `path` for the functions passed (a mapping from
    the names they were saved under to fastpjit functions) and caches it, so that the first
    real call of each is a cache hit. Each signature is replayed by one call on zero-filled
    arguments; those that this process cannot rebuild, whose arguments take more than
    `max_bytes`, past the first `max_signatures` of their function, or whose replay raises are
    skipped with their reason (None: no limit). Only the functions passed are called. Ctrl-C
    stops it. Returns a `WarmUpReport`."""
    if not isinstance(functions, Mapping):
        raise TypeError(
            f"functions: expected a mapping from names to fastpjit functions, "
            f"got {type(functions).__qualname__}"
        )
    for fn in functions.values():
        log_of(fn)
    for name, value, least in (
        ("threads", threads, 1),
        ("max_bytes", max_bytes, 0),
        ("max_signatures", max_signatures, 0),
    ):
        if value is not None and (type(value) is not int or value < least):
            raise ValueError(f"{name}: expected an int of at least {least} or None, got {value!r}")
    record = load_record(path)
    start = time.perf_counter()
    mismatch = _version_mismatch(record["versions"])
    tasks = [
        (name, i, signature)
        for name, fn in functions.items()
        for i, signature in enumerate(record["functions"].get(name, {}).get("signatures", []))
    ]
    rebuilder = _Rebuilder()
    conflicts = {} if mismatch is not None else _adopt_options(functions, tasks)

    def replay(task: tuple[str, int, dict[str, Any]]) -> WarmUpEntry:
        name, i, signature = task
        began = time.perf_counter()
        if mismatch is not None:
            return WarmUpEntry(name, i, "skipped", 0.0, mismatch)
        fn = _unbound(functions[name])
        config = signature["config"]
        try:
            if (name, i) in conflicts:
                raise Skipped(conflicts[name, i])
            if max_signatures is not None and i >= max_signatures:
                raise Skipped(f"past the first max_signatures={max_signatures} of the function")
            statics = log_of(fn).statics_differ(signature)
            if statics is not None:
                raise Skipped(statics)
            size = _signature_bytes(signature)
            if max_bytes is not None and size > max_bytes:
                raise Skipped(f"its arguments take {size} bytes, more than max_bytes={max_bytes}")
            with contextlib.ExitStack() as scope:
                scope.enter_context(jax.enable_x64(config["jax_enable_x64"]))
                if config["mesh"] is not None:
                    scope.enter_context(jax.set_mesh(rebuilder.mesh(config["mesh"])))
                args, kwargs = rebuilder.call(signature)
                compiles, loaded = thread_compile_events()
                jax.block_until_ready(fn(*args, **kwargs))
                compiles_after, loaded_after = thread_compile_events()
        except Skipped as why:
            return WarmUpEntry(name, i, "skipped", time.perf_counter() - began, str(why))
        except Exception as error:  # noqa: BLE001 - one signature never ends the replay
            first_line = str(error).strip().split("\n", 1)[0]
            reason = f"the replay raised {type(error).__name__}: {first_line}"
            return WarmUpEntry(name, i, "skipped", time.perf_counter() - began, reason)
        if loaded_after > loaded:
            outcome = "loaded"
        elif compiles_after > compiles:
            outcome = "compiled"
        else:
            outcome = "cached"
        return WarmUpEntry(name, i, outcome, time.perf_counter() - began)

    workers = threads or min(len(tasks), os.cpu_count() or 1) or 1
    if jax.process_count() > 1:
        workers = 1  # every process replays its collectives in the record's order
    entries = _run(replay, tasks, workers)
    return WarmUpReport(tuple(entries), time.perf_counter() - start)


def _adopt_options(
    functions: Mapping[str, Any], tasks: list[tuple[str, int, Signature]]
) -> dict[tuple[str, int], str]:
    """Has each function compile its recorded signatures with the compile options recorded
    with them, registering them where it has none for a signature; returns why each signature
    whose function has others (or takes none per signature) is skipped. Run before any replay,
    so that no registration forgets an executable that another replay compiled."""
    conflicts = {}
    abstract = _Rebuilder(abstract=True)
    for name, i, signature in tasks:
        fn = _unbound(functions[name])
        recorded = signature.get("compiler_options", {})
        options = getattr(fn, "_signature_options", None)
        if options is None or not (recorded or options.registered()):
            if recorded:
                why = f"recorded with the compiler options {recorded}, which {fn!r} cannot take"
                conflicts[name, i] = why
            continue
        try:
            with jax.enable_x64(signature["config"]["jax_enable_x64"]):
                args, kwargs = abstract.call(signature)
                conflict = options.adopt(recorded, args, kwargs)
        except Exception:  # noqa: BLE001 - the replay of the signature says why
            continue
        if conflict is not None:
            conflicts[name, i] = conflict
    return conflicts


def _unbound(fn: Any) -> Callable[..., Any]:
    """The function whose calls were recorded: a bound function's is the one it binds."""
    return fn._function if isinstance(fn, Bound) else fn


def _run(replay: Callable[[Any], WarmUpEntry], tasks: list[Any], workers: int) -> list[WarmUpEntry]:
    progress = _progress(len(tasks))
    try:
        if workers == 1:
            results = []
            for task in tasks:
                results.append(replay(task))
                progress(1)
            return results
        pool = ThreadPoolExecutor(workers, thread_name_prefix="fastpjit-warm-up")
        try:
            futures = [pool.submit(replay, task) for task in tasks]
            results = []
            for future in futures:
                results.append(future.result())
                progress(1)
            return results
        finally:
            # On Ctrl-C, at once: the signatures not begun are dropped, and those compiling
            # end on their own.
            pool.shutdown(wait=False, cancel_futures=True)
    finally:
        progress(0, close=True)


def _progress(total: int) -> Callable[..., None]:
    try:
        from tqdm import tqdm  # type: ignore[import-untyped]
    except ImportError:
        return lambda n, close=False: None
    bar = tqdm(
        total=total, desc="fastpjit warm_up", unit="signature", leave=False, disable=total == 0
    )

    def update(n: int, close: bool = False) -> None:
        if close:
            bar.close()
        else:
            bar.update(n)

    return update


def _version_mismatch(recorded: dict[str, str]) -> str | None:
    current = versions()
    for name in ("fastpjit", "jax", "jaxlib"):
        if recorded[name] != current[name]:
            return f"recorded with {name} {recorded[name]}, and this process runs {current[name]}"
    return None
