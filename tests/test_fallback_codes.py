"""The fallback codes: one vocabulary, defined by the core, named the same in the docs."""

import pathlib
import re

import fastpjit

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs" / "fallbacks.md"


def test_the_docs_list_every_code_with_its_text():
    rows = re.findall(r"^\| `([^`]+)` \| (.+) \|$", DOCS.read_text(), re.MULTILINE)
    assert dict(rows) == fastpjit.fallback_reasons()
    assert len(rows) == len(fastpjit.fallback_reasons())


def test_the_run_summary_names_codes_and_texts():
    from fastpjit.__main__ import summary

    counts = {"calls": 2, "cache_hits": 0, "cache_misses": 1, "jax_calls": 1, "traced": 0}
    stats = {"functions": {"m.f": {**counts, "compiles": 0, "fallbacks": {"disable_jit": 1}}}}
    text = fastpjit.fallback_reasons()["disable_jit"]
    assert f"m.f: 1 × disable_jit: {text}" in summary(stats)
