"""JAX as the oracle: the assertions that compare fastpjit's outputs and errors with JAX's, and
the pairs of functions (`both`) that they compare, shared by the test files."""

from __future__ import annotations

import re
import types
from typing import Any

import jax
import numpy as np
import pytest
from lines import without_source_location

import fastpjit

# --- Outputs ----------------------------------------------------------------------------------


def assert_same_outputs(ours: Any, theirs: Any) -> None:
    """The same output tree, of the same containers, whose leaves agree by `assert_same_leaf`."""
    assert jax.tree.structure(ours) == jax.tree.structure(theirs)
    assert_same_containers(ours, theirs)
    paths = jax.tree_util.tree_flatten_with_path(theirs)[0]
    for mine, (path, leaf) in zip(jax.tree.leaves(ours), paths, strict=True):
        assert_same_leaf(mine, leaf, jax.tree_util.keystr(path))


def assert_same_containers(ours: Any, theirs: Any) -> None:
    """The same containers, of the same exact types, with dict keys in the same order (tree
    structures do not compare the order of a dict's keys)."""
    assert type(ours) is type(theirs), f"{type(ours).__name__} != {type(theirs).__name__}"
    if isinstance(theirs, dict):
        assert list(ours) == list(theirs), f"dict keys {list(ours)} != {list(theirs)}"
        for key in theirs:
            assert_same_containers(ours[key], theirs[key])
    elif isinstance(theirs, (tuple, list)):
        assert len(ours) == len(theirs)
        for mine, their in zip(ours, theirs, strict=True):
            assert_same_containers(mine, their)


def assert_same_leaf(ours: Any, theirs: Any, where: str = "") -> None:
    """A jax.Array by `assert_same_array`; anything else of the same type, and equal."""
    if isinstance(theirs, jax.Array):
        assert_same_array(ours, theirs, where)
    else:
        assert type(ours) is type(theirs), where
        assert ours == theirs, where


def assert_same_array(ours: Any, theirs: Any, where: str = "") -> None:
    """`ours` is JAX's jax.Array `theirs` in all that a caller sees: type, shape, dtype, weak
    type, aval, sharding, commitment, and each addressable shard's device and value (a PRNG
    key's by its key data). Shard by shard, so that replicas and the partial sums of unreduced
    axes are compared too, and so that it holds across processes. (Equal shardings give each
    device the same index: unreduced shardings have none to read.)"""
    assert type(ours) is type(theirs), where
    assert (ours.shape, ours.dtype) == (theirs.shape, theirs.dtype), (where, ours, theirs)
    assert ours.aval.weak_type == theirs.aval.weak_type, where
    assert ours.aval == theirs.aval, (where, ours.aval, theirs.aval)
    assert ours.sharding == theirs.sharding, (where, ours.sharding, theirs.sharding)
    assert ours.committed == theirs.committed, where
    if jax.dtypes.issubdtype(theirs.dtype, jax.dtypes.prng_key):
        # Only the keys' shardings must be equal: JAX's own pmap gives their key data
        # equivalent but unequal ones (P(i, None) on a miss, P(i) on its fast path).
        ours, theirs = jax.random.key_data(ours), jax.random.key_data(theirs)
    ours_shards, theirs_shards = _shards(ours), _shards(theirs)
    assert [s.device for s in ours_shards] == [s.device for s in theirs_shards], where
    for a, b in zip(ours_shards, theirs_shards, strict=True):
        np.testing.assert_array_equal(_values(a.data), _values(b.data), err_msg=where, strict=True)


def _shards(array: jax.Array) -> list[Any]:
    return sorted(array.addressable_shards, key=lambda shard: shard.device.id)


def _values(array: jax.Array) -> np.ndarray:
    """The array on the host, in a dtype that numpy compares: ml_dtypes' narrow floats (whose
    NaNs numpy cannot find) as float32, their narrow ints as int32."""
    values = np.asarray(array)
    if values.dtype.type.__module__ == "numpy":
        return values
    return values.astype(
        np.float32 if jax.dtypes.issubdtype(values.dtype, np.floating) else np.int32
    )


def host_bytes(value: Any) -> tuple[np.dtype, tuple[int, ...], bytes]:
    """Everything that identifies a host value, NaN payloads and -0.0 included."""
    value = np.asarray(value)
    return value.dtype, value.shape, np.ascontiguousarray(value).tobytes()


def assert_same_bits(ours: Any, theirs: Any) -> None:
    """The same tree, whose leaves hold bitwise the same values (of the same dtypes)."""
    ours_leaves, ours_tree = jax.tree.flatten(ours)
    theirs_leaves, theirs_tree = jax.tree.flatten(theirs)
    assert ours_tree == theirs_tree
    for a, b in zip(ours_leaves, theirs_leaves, strict=True):
        assert host_bytes(a) == host_bytes(b)


# --- Errors -----------------------------------------------------------------------------------


def assert_same_error(ours: Any, theirs: Any, *args: Any, **kwargs: Any) -> BaseException:
    """Both calls raise the same exception type with the same message (object addresses and
    JAX's source location aside). Returns JAX's exception."""
    expected, got = _raised_by_both(ours, theirs, args, kwargs)
    # JAX's side may call a copy of the function (see `both`), which may show in the message.
    assert without_addresses(str(got)) == without_addresses(str(expected))
    return expected


def assert_same_error_type(ours: Any, theirs: Any, *args: Any, **kwargs: Any) -> BaseException:
    """Both calls raise the same exception type: for errors whose message JAX itself words
    differently from one call path to another. Returns JAX's exception."""
    return _raised_by_both(ours, theirs, args, kwargs)[0]


def _raised_by_both(
    ours: Any, theirs: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[BaseException, BaseException]:
    with pytest.raises(Exception) as expected:
        theirs(*args, **kwargs)
    with pytest.raises(type(expected.value)) as got:
        ours(*args, **kwargs)
    assert type(got.value) is type(expected.value)
    return expected.value, got.value


def without_addresses(message: str) -> str:
    """`message` without object addresses, and with JAX's source location cut to its file."""
    return re.sub(r" at 0x[0-9a-f]+", " at 0x…", without_source_location(message))


# --- The pairs compared -----------------------------------------------------------------------


def both(fun: Any, *positional: Any, api: str = "jit", **options: Any) -> tuple[Any, Any]:
    """fastpjit's and JAX's `api` ("jit" or "pmap") of `fun`. JAX's traces a copy of the
    function, so that neither side's trace, lowering or compile serves the other: each side
    compiles its own executable and the outputs of JAX's are the oracle."""
    ours, theirs = getattr(fastpjit, api), getattr(jax, api)
    return ours(fun, *positional, **options), theirs(fresh_if_function(fun), *positional, **options)


def fresh_if_function(fun: Any) -> Any:
    return fresh(fun) if isinstance(fun, types.FunctionType) else fun


def fresh(fun: Any) -> Any:
    """A new function object with `fun`'s code. JAX shares its dispatch cache among the
    jax.jit objects of one function (and its trace and compile caches), so tests that compare
    cache sizes or count compiles start from a function no other test has jitted."""
    copy = types.FunctionType(
        fun.__code__, fun.__globals__, fun.__name__, fun.__defaults__, fun.__closure__
    )
    copy.__kwdefaults__ = fun.__kwdefaults__
    return copy


def check_calls(ours: Any, theirs: Any, *args: Any, repeats: int = 3, **kwargs: Any) -> Any:
    """Calls both `repeats` times with the same arguments (a miss, then hits) and compares."""
    out = None
    for _ in range(repeats):
        expected = theirs(*args, **kwargs)
        out = ours(*args, **kwargs)
        assert_same_outputs(out, expected)
    return out
