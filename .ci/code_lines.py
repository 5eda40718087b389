"""Code lines and test counts of the two Rust layers.

A code line is a line that is neither blank nor a comment, outside a
`#[cfg(test)]` module. Usage: python .ci/code_lines.py
"""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent


def count(crate: str) -> tuple[int, int, int]:
    code = tests = test_lines = 0
    for path in sorted((ROOT / crate / "src").rglob("*.rs")):
        in_test, depth = False, 0
        pending_cfg = False
        for raw in path.read_text().splitlines():
            line = raw.strip()
            if not in_test and line.startswith("#[cfg(test)]"):
                pending_cfg = True
                continue
            if pending_cfg and line.startswith("mod "):
                in_test, depth, pending_cfg = True, 0, False
            elif pending_cfg and line:
                pending_cfg = False
            if in_test:
                depth += raw.count("{") - raw.count("}")
                if re.match(r"#\[(test|pyo3::test)?\]|#\[test\]", line) or line.startswith("proptest!") or re.match(r"fn \w+\(.*\)\s*\{?$", line) and False:
                    pass
                if line == "#[test]":
                    tests += 1
                if line and not line.startswith("//"):
                    test_lines += 1
                if depth <= 0 and "}" in raw:
                    in_test = False
                continue
            if line and not line.startswith("//"):
                code += 1
    return code, tests, test_lines


for crate in ("rust/core", "rust/bindings"):
    code, tests, test_lines = count(crate)
    print(f"{crate:14} {code:6} code lines  {tests:4} tests ({test_lines} test lines)")
