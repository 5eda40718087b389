"""The package surface: version, stats, and the typed stub."""

import typing

import jax.numpy as jnp
import pytest

import fastpjit
from fastpjit._stats import FunctionStats, HostPoolStats, Stats


def test_version_matches_the_native_module():
    assert fastpjit.__version__ == fastpjit._core.__version__
    assert fastpjit.__version__.count(".") == 2


def test_stats_start_empty_and_count_fallbacks():
    fastpjit.reset_stats()
    stats = fastpjit.stats()
    pool = stats.pop("host_pool")
    assert stats == {
        "cache_hits": 0,
        "cache_misses": 0,
        "compiles": 0,
        "fallbacks": {},
        "recompiles_stopped": 0,
        "functions": {},
    }
    # The host pool's counters restart; its idle memory stays.
    assert (pool["hits"], pool["misses"]) == (0, 0) and pool["limit"] == 1 << 30
    assert 0 <= pool["idle_bytes"] <= pool["limit"]
    fastpjit._core.count_fallback("device_put.float0")
    fastpjit._core.count_fallback("device_put.float0")
    assert fastpjit.stats()["fallbacks"] == {"device_put.float0": 2}
    fastpjit.reset_stats()
    assert fastpjit.stats()["fallbacks"] == {}


def _assert_shape(value, typed_dict):
    hints = typing.get_type_hints(typed_dict)
    required = hints.keys() - typed_dict.__optional_keys__
    assert required <= set(value) <= set(hints), (typed_dict.__name__, set(value) ^ set(hints))
    for key, hint in hints.items():
        if key not in value:
            continue
        origin = typing.get_origin(hint)
        if typing.is_typeddict(hint):
            _assert_shape(value[key], hint)
        elif origin is dict:
            _, item = typing.get_args(hint)
            assert isinstance(value[key], dict), key
            for inner in value[key].values():
                if item is int:
                    assert type(inner) is int, key
                else:
                    _assert_shape(inner, item)
        elif hint is float:
            assert type(value[key]) is float, key
        else:
            assert type(value[key]) is int, key


def test_stats_have_the_shape_that_the_stub_declares():
    fastpjit.reset_stats()
    f = fastpjit.jit(lambda x: x + 1)
    f(jnp.ones(4))
    with fastpjit.timing():
        f(jnp.ones(4))
    fastpjit._core.count_fallback("device_put.float0")
    stats = fastpjit.stats()
    assert stats["functions"] and stats["fallbacks"]
    _assert_shape(stats, Stats)
    assert typing.get_type_hints(Stats)["functions"] == dict[str, FunctionStats]
    assert typing.get_type_hints(Stats)["host_pool"] is HostPoolStats
    fastpjit.reset_stats()


@pytest.mark.slow
@pytest.mark.subprocess
def test_stub_matches_the_native_module():
    # mypy.stubtest checks every name and signature of _core.pyi against the binary.
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "fastpjit._core"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
