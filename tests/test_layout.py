"""The package's layout: no import cycle among fastpjit's Python modules, nor among the Rust
bindings' files. For Python, the imports made inside functions count too (a cycle hidden in a
function is still a cycle); only imports under `if TYPE_CHECKING:`, which never run, are left
out."""

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "python" / "fastpjit"


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(node: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import under `node`, at any depth, except those under `if TYPE_CHECKING:`."""
    found: list[ast.Import | ast.ImportFrom] = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            found.append(child)
        elif isinstance(child, ast.If) and is_type_checking(child.test):
            found.extend(imports(ast.Module(body=child.orelse, type_ignores=[])))
        else:
            found.extend(imports(child))
    return found


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Each module of the package, with the modules of the package that it imports. `from
    package import name` imports the submodule `name` where there is one, else the package;
    importing a submodule is not counted as importing its parent packages."""
    paths = {module_name(p, root): p for p in root.rglob("*.py")}
    submodules = set(paths) | {
        f"{module_name(p.parent / '__init__.py', root)}.{p.name.split('.')[0]}"
        for pattern in ("*.so", "*.pyi")
        for p in root.rglob(pattern)
    }
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
                continue
            source = node.module or ""
            if node.level:  # relative: from the package, `level - 1` packages up
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                source = f"{base}.{source}" if source else base
            for alias in node.names:
                child = f"{source}.{alias.name}"
                targets.add(child if child in submodules else source)
        graph[name] = {t for t in targets if t in paths and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def a_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One cycle through a component's first module, as a path of imports."""
    start = component[0]
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for target in sorted(graph[node] & set(component)):
            if target == start:
                return [*paths[node], start]
            if target not in paths:
                paths[target] = [*paths[node], target]
                queue.append(target)
    return component


def test_the_graph_sees_the_package():
    graph = import_graph()
    assert {"fastpjit", "fastpjit.jit", "fastpjit.explain", "fastpjit._jax.api"} <= graph.keys()
    assert "fastpjit.jit" in graph["fastpjit.explain"]
    assert "fastpjit._recompiles" in graph["fastpjit.jit"]
    # A function's import counts; one under TYPE_CHECKING does not.
    assert "fastpjit._jax.line" in graph["fastpjit.launch"]
    assert "fastpjit.warm_start.log" not in graph["fastpjit._explainable"]


def test_the_graph_resolves_relative_imports_and_leaves_out_type_checking(tmp_path):
    files = {
        "__init__.py": "from pkg import a\n",
        "a.py": "from . import b\nif TYPE_CHECKING:\n    from pkg import c\n",
        "b.py": "def f():\n    from .a import x\n",
        "c.py": "import pkg.a\n",
        "sub/__init__.py": "",
        "sub/d.py": "from .. import b\nfrom ..c import y\n",
    }
    for name, text in files.items():
        (tmp_path / "pkg" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / name).write_text(text)
    graph = import_graph(tmp_path / "pkg")
    assert graph == {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.a"},
        "pkg.c": {"pkg.a"},
        "pkg.sub": set(),
        "pkg.sub.d": {"pkg.b", "pkg.c"},
    }
    assert cycles(graph) == [["pkg.a", "pkg.b"]]


def test_the_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert a_cycle(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]


def test_no_import_cycles():
    graph = import_graph()
    found = [" -> ".join(a_cycle(graph, component)) for component in cycles(graph)]
    assert not found, "import cycles:\n" + "\n".join(found)


# -- The Rust bindings ------------------------------------------------------------------------

BINDINGS = PACKAGE.parent.parent / "rust" / "bindings" / "src"


def rust_module(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return "::".join(parts[:-1] if parts[-1] in ("mod", "lib") else parts) or "crate"


def rust_import_graph(root: Path = BINDINGS) -> dict[str, set[str]]:
    """Each module of a crate, with the modules of the crate that its `use crate::` and `use
    super::` items name (outside its tests)."""
    texts = {rust_module(p, root): p.read_text() for p in root.rglob("*.rs")}
    graph: dict[str, set[str]] = {}
    for name, text in texts.items():
        code = text.split("#[cfg(test)]")[0]
        own = name.split("::") if name != "crate" else []
        is_dir = (root / name.replace("::", "/") / "mod.rs").exists()
        deps = set()
        for anchor, items in re.findall(r"\buse (crate|super)::([\w:]+|\{[^}]*\})", code):
            base = [] if anchor == "crate" else own if is_dir else own[:-1]
            for item in re.findall(r"[\w:]+", items):
                segments = base + item.split("::")
                for k in range(len(segments), 0, -1):
                    target = "::".join(segments[:k])
                    if target in texts and target != name:
                        deps.add(target)
                        break
        graph[name] = deps
    return graph


def test_the_rust_graph_sees_the_bindings():
    graph = rust_import_graph()
    assert "dispatch::shared" in graph["dispatch::function"]
    assert "handles" in graph["errors"]


def test_no_binding_import_cycles():
    # handles.rs is the ground floor: it imports nothing of the crate.
    graph = rust_import_graph()
    assert graph["handles"] == set()
    assert cycles(graph) == []
