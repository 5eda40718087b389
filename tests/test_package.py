"""The package surface: version, stats, and the typed stub."""

import fastpjit


def test_version_matches_the_native_module():
    assert fastpjit.__version__ == fastpjit._core.__version__
    assert fastpjit.__version__.count(".") == 2


def test_stats_start_empty_and_count_fallbacks():
    fastpjit.reset_stats()
    stats = fastpjit.stats()
    pool = stats.pop("host_pool")
    assert stats == {"cache_hits": 0, "cache_misses": 0, "compiles": 0, "fallbacks": {},
                     "recompiles_stopped": 0, "functions": {}}
    # The host pool's counters restart; its idle memory stays.
    assert (pool["hits"], pool["misses"]) == (0, 0) and pool["limit"] == 1 << 30
    assert 0 <= pool["idle_bytes"] <= pool["limit"]
    fastpjit._core.count_fallback("test reason")
    fastpjit._core.count_fallback("test reason")
    assert fastpjit.stats()["fallbacks"] == {"test reason": 2}
    fastpjit.reset_stats()
    assert fastpjit.stats()["fallbacks"] == {}


def test_stub_matches_the_native_module():
    # mypy.stubtest checks every name and signature of _core.pyi against the binary.
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "fastpjit._core"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
