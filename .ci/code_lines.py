"""Code lines and tests of the two Rust layers: `python .ci/code_lines.py`.

A code line is neither blank nor a comment, and lies outside the file's test module (a
`#[cfg(test)]` module, which every file keeps at its end) and any other item marked
`#[cfg(test)]`. A test is a `#[test]` function, or a property in a `proptest!` block.
"""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
TEST_MODULE = re.compile(r"^#\[cfg\(test\)\]\n(#\[.*\]\n)*mod \w+ \{$", re.M)


def code_lines(source: str) -> int:
    source = TEST_MODULE.split(source)[0]
    count, skipping, depth = 0, False, 0
    for line in source.splitlines():
        stripped = line.strip()
        if stripped.startswith("#[cfg(test)]"):
            skipping, depth = True, 0
        elif skipping:
            depth += line.count("{") - line.count("}")
            skipping = not (depth <= 0 and ("}" in line or stripped.endswith(";")))
        elif stripped and not stripped.startswith("//"):
            count += 1
    return count


def count(crate: str) -> tuple[int, int]:
    code = tests = 0
    for path in sorted((ROOT / crate / "src").rglob("*.rs")):
        source = path.read_text()
        code += code_lines(source)
        tests += source.count("#[test]")
        for block in re.findall(r"proptest! \{(.*?)\n    \}", source, re.S):
            tests += len(re.findall(r"\n\s+fn \w+", block))
    return code, tests


for crate in ("rust/core", "rust/bindings"):
    code, tests = count(crate)
    print(f"{crate:14} {code:6} code lines {tests:5} tests")
