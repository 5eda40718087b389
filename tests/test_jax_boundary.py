"""Canaries for every JAX and jaxlib assumption of fastpjit's boundary (`fastpjit._jax`) and of
the Rust handle tables: a JAX upgrade that breaks one fails here, naming it.

A JAX upgrade reads `PRIVATE_NAMES` (each private name, where it lives, what kind of object it
must be, and on which JAX lines), `JIT_KEY_ONLY_STATES` and `RUST_CALLS_BY_NAME`; the tests below
keep those lists complete (against the boundary's own imports, JAX's sources and the Rust
sources) and check each on a tiny example, on the running line.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import inspect
import pathlib
import re
import subprocess
import sys
import textwrap
import tomllib
import types
from typing import Any

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
import pytest
from jax._src.lib import jaxlib_extension_version
from jax.sharding import AbstractMesh, Mesh, NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P
from lines import ON_0_10

from fastpjit import _jax
from fastpjit._jax import jit_miss, line

ROOT = pathlib.Path(__file__).resolve().parent.parent
BOUNDARY = pathlib.Path(_jax.__file__).parent
RUST_SOURCES = ROOT / "rust" / "bindings" / "src"
DEVICES = jax.devices()

# The JAX releases that fastpjit is tested on, by line: every assumption below was checked on
# each of them.
TESTED = {"0.10": ("0.10.2",), "0.11": ("0.11.2", "0.12.0", "0.12.0.1")}
BOTH_LINES = ("0.10", "0.11")

CALLABLE = "callable"
CLASS = "class"
GETTER = "property getter"  # read from the class: vars(cls)[name].fget
METHOD = "method"  # a function in the class's own namespace, called unbound
MEMBER = "enum member"
VALUE = "value"  # any object that exists: a config state, a registry, a constant


@dataclasses.dataclass(frozen=True)
class Name:
    """A private name: `module` and the attribute path in it, the kind fastpjit needs, and the
    JAX lines on which fastpjit reads it (`fastpjit._jax.line` chooses)."""

    module: str
    path: str
    kind: str
    lines: tuple[str, ...] = BOTH_LINES

    def __str__(self) -> str:
        only = "" if self.lines == BOTH_LINES else f", {'/'.join(self.lines)} only"
        return f"{self.module}.{self.path} ({self.kind}{only})"


# Every private JAX/jaxlib name that fastpjit._jax takes from a module, by module.
PRIVATE_NAMES = [
    Name("jax._src.api", "jit", CALLABLE),
    Name("jax._src.api", "_post_hook_state", VALUE),
    Name("jax._src.api_util", "InternalFloatingPointError", CLASS),
    Name("jax._src.api_util", "maybe_recursive_nan_check", CALLABLE),
    Name("jax._src.array", "ArrayImpl", CLASS),
    Name("jax._src.lax.lax", "_convert_element_type", CALLABLE),
    Name("jax._src.array", "ArrayImpl.aval", GETTER),
    Name("jax._src.array", "ArrayImpl._sharding", GETTER),
    Name("jax._src.array", "ArrayImpl._committed", GETTER),
    Name("jax._src.array", "ArrayImpl._arrays", GETTER),
    Name("jax._src.array", "ArrayImpl._npy_value", GETTER),
    Name("jax._src.array", "ArrayImpl.is_deleted", METHOD),
    Name("jax._src.array", "ArrayImpl._rewrap_with_aval_and_sharding", METHOD),
    Name("jax._src.array", "ArrayImpl._single_device_array_to_np_array_did_copy", METHOD),
    Name("jax._src.array", "ArrayImpl._copy_single_device_array_to_host_async", METHOD),
    Name("jax._src.array", "ArrayImpl.on_device_size_in_bytes", METHOD),
    Name("jax._src.clusters", "ClusterEnv", CLASS),
    Name("jax._src.clusters", "ClusterEnv._cluster_types", VALUE),
    Name("jax._src.compiler", "compile_or_get_cached", CALLABLE),
    Name("jax._src.compiler", "get_compile_options", CALLABLE),
    Name("jax._src.compiler", "use_detailed_logging", CALLABLE),
    Name("jax._src.config", "debug_key_reuse", VALUE),
    Name("jax._src.config", "device_context", VALUE, lines=("0.10",)),
    Name("jax._src.config", "disable_jit", VALUE),
    Name("jax._src.config", "enable_pgle", VALUE),
    Name("jax._src.config", "explicit_device_put_scope", CALLABLE),
    Name("jax._src.config", "jax_pallas_auto_assign_collective_ids", VALUE, lines=("0.11",)),
    Name("jax._src.config", "jax_pallas_auto_assign_collective_ids_limit", VALUE, lines=("0.11",)),
    Name("jax._src.config", "memory_fitting_level", VALUE),
    Name("jax._src.config", "optimization_level", VALUE),
    Name("jax._src.config", "trace_context", CALLABLE),
    Name("jax._src.config", "trace_context_names", CALLABLE),
    Name("jax._src.core", "ShapedArray", CLASS),
    Name("jax._src.core", "ShapedArray.str_short", METHOD),
    Name("jax._src.core", "abstract_token", VALUE),
    Name("jax._src.core", "check_eval_args", CALLABLE),
    Name("jax._src.core", "full_lower", CALLABLE),
    Name("jax._src.core", "trace_state", VALUE),
    Name("jax._src.core", "trace_state_clean", CALLABLE),
    Name("jax._src.distributed", "global_state", VALUE),
    Name("jax._src.distributed", "State.initialize", METHOD),
    Name("jax._src.distributed", "State.client", VALUE),
    Name("jax._src.distributed", "State.num_processes", VALUE),
    Name("jax._src.distributed", "State.preemption_sync_manager", VALUE),
    Name("jax._src.dispatch", "BACKEND_COMPILE_EVENT", VALUE),
    Name("jax._src.dispatch", "check_arg", CALLABLE),
    Name("jax._src.dispatch", "log_elapsed_time", CALLABLE),
    Name("jax._src.dispatch", "update_dp_aval", CALLABLE),
    Name("jax._src.dtypes", "canonicalize_dtype", CALLABLE),
    Name("jax._src.dtypes", "check_valid_dtype", CALLABLE),
    Name("jax._src.dtypes", "extended", CLASS),
    Name("jax._src.dtypes", "issubdtype", CALLABLE),
    Name("jax._src.dtypes", "python_scalar_types_to_dtypes", VALUE),
    Name("jax._src.interpreters.mlir", "LoweringParameters", CLASS),
    Name("jax._src.interpreters.mlir", "_dtype_to_ir_type", VALUE),
    Name("jax._src.interpreters.mlir", "contains_unconstrained", CALLABLE),
    Name("jax._src.interpreters.mlir", "make_ir_context", CALLABLE),
    Name("jax._src.interpreters.pxla", "ExecuteReplicated", CLASS),
    Name("jax._src.interpreters.pxla", "MeshComputation", CLASS),
    Name("jax._src.interpreters.pxla", "MeshExecutableFastpathData", CLASS),
    Name("jax._src.interpreters.pxla", "UnloadedMeshExecutable", CLASS),
    Name("jax._src.interpreters.pxla", "UnloadedMeshExecutable.load", METHOD),
    Name("jax._src.interpreters.pxla", "_get_layouts_from_executable", CALLABLE),
    Name("jax._src.interpreters.pxla", "cc_shard_arg", CALLABLE),
    Name("jax._src.interpreters.pxla", "finalize_shardings", CALLABLE),
    Name("jax._src.interpreters.pxla", "get_dispatch_layouts", CALLABLE),
    Name("jax._src.interpreters.pxla", "maybe_concretize_mesh", CALLABLE),
    Name("jax._src.interpreters.pxla", "maybe_recover_user_shardings", CALLABLE),
    Name("jax._src.interpreters.pxla", "reflatten_outputs_for_dispatch", CALLABLE),
    Name("jax._src.interpreters.pxla", "shard_args", CALLABLE),
    Name("jax._src.lib", "jaxlib_extension_version", VALUE),
    Name("jax._src.lib._jax", "ExecuteResults.consume_with_handlers", METHOD),
    Name("jax._src.lib._jax", "JaxRuntimeError", CLASS),
    Name("jax._src.lib._jax", "LoadedExecutable.execute_sharded", METHOD),
    Name("jax._src.lib._jax", "batched_copy_array_to_devices_with_sharding", CALLABLE),
    Name("jax._src.lib._jax", "collect_garbage", CALLABLE),
    Name("jax._src.lib._jax", "config.Config.value", GETTER),
    Name("jax._src.lib._jax", "mlir.deserialize_portable_artifact", CALLABLE),
    Name("jax._src.lib._jax", "mlir.hlo_to_stablehlo", CALLABLE),
    Name("jax._src.lib._jax", "pytree.PyTreeDef.node_data", METHOD),
    Name("jax._src.lib._jax", "pytree.PyTreeDef.children", METHOD),
    Name("jax._src.lib._jax", "pytree.PyTreeDef.num_nodes", GETTER),
    Name("jax._src.lib._jax", "pytree.PyTreeDef.num_leaves", GETTER),
    Name("jax._src.lib._jax", "pytree.PyTreeDef.unflatten", METHOD),
    Name("jax._src.lib.guard_lib", "TransferGuardLevel.ALLOW", MEMBER),
    Name("jax._src.lib.guard_lib", "global_state", CALLABLE),
    Name("jax._src.lib.guard_lib", "thread_local_state", CALLABLE),
    Name("jax._src.lib.mlir.dialects.sdy", "MeshAttr", CLASS),
    Name("jax._src.lib.mlir.dialects.sdy", "MeshAxisAttr", CLASS),
    Name("jax._src.lib.mlir.ir", "ArrayAttr", CLASS),
    Name("jax._src.lib.mlir.ir", "Attribute", CLASS),
    Name("jax._src.lib.mlir.ir", "BoolAttr", CLASS),
    Name("jax._src.lib.mlir.ir", "Context", CLASS),
    Name("jax._src.lib.mlir.ir", "DictAttr", CLASS),
    Name("jax._src.lib.mlir.ir", "Module", CLASS),
    Name("jax._src.lib.mlir.ir", "RankedTensorType", CLASS),
    Name("jax._src.lib.mlir.ir", "StringAttr", CLASS),
    Name("jax._src.lib.mlir.ir", "WalkResult.ADVANCE", MEMBER),
    Name("jax._src.lib.xla_client", "ArrayCopySemantics.REUSE_INPUT", MEMBER),
    Name("jax._src.lib.xla_client", "ArrayImpl", CLASS),
    Name("jax._src.lib.xla_client", "DeviceList", CLASS),
    Name("jax._src.lib.xla_client", "HloSharding.from_proto", CALLABLE),
    Name("jax._src.lib.xla_client", "HloSharding.from_string", CALLABLE),
    Name("jax._src.lib.xla_client", "HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL", MEMBER),
    Name("jax._src.lib.xla_client", "HostBufferSemantics.ZERO_COPY", MEMBER),
    Name("jax._src.lib.xla_client", "OpSharding.Type.REPLICATED", MEMBER),
    Name("jax._src.lib.xla_client", "XlaComputation", CLASS),
    Name("jax._src.lib.xla_client", "array_result_handler", CALLABLE),
    Name("jax._src.lib.xla_client", "batched_device_put", CALLABLE),
    Name("jax._src.lib.xla_client", "hlo.HloModule.from_serialized_hlo_module_proto", CALLABLE),
    Name("jax._src.lib.xla_client", "hlo.hlo_module_from_text", CALLABLE),
    Name("jax._src.mesh", "AxisType.Auto", MEMBER),
    Name("jax._src.mesh", "Mesh", CLASS),
    Name("jax._src.mesh", "thread_resources", VALUE),
    Name("jax._src.mesh", "device_context", VALUE, lines=("0.11",)),
    Name("jax._src.named_sharding", "DuplicateSpecError", CLASS),
    Name("jax._src.named_sharding", "NamedSharding", CLASS),
    Name("jax._src.named_sharding", "NamedSharding._logical_device_ids", VALUE),
    Name("jax._src.op_shardings", "are_hlo_shardings_equal", CALLABLE),
    Name("jax._src.pjit", "PjitInfo", CLASS),
    Name("jax._src.pjit", "_get_fastpath_data", CALLABLE),
    Name("jax._src.pjit", "_infer_params", CALLABLE),
    Name("jax._src.pjit", "_resolve_and_lower", CALLABLE),
    Name("jax._src.pjit", "_run_python_pjit", CALLABLE),
    Name("jax._src.pjit", "convert_to_metaty", CALLABLE),
    Name("jax._src.pjit", "pjit", CALLABLE),
    Name("jax._src.pmap", "_get_out_shardings", CALLABLE),
    Name("jax._src.pmap", "_global_to_local_aval", CALLABLE),
    Name("jax._src.pmap", "_is_sharding_equivalent", CALLABLE),
    Name("jax._src.pmap", "_local_to_global_aval", CALLABLE),
    Name("jax._src.pmap", "global_array_to_host_local_array", CALLABLE),
    Name("jax._src.pmap", "pmap", CALLABLE),
    Name("jax._src.sharding", "IndivisibleError", CLASS),
    Name("jax._src.sharding", "Sharding._to_xla_hlo_sharding", METHOD),
    Name("jax._src.sharding", "Sharding._device_assignment", VALUE),
    Name("jax._src.sharding", "Sharding._internal_device_list", VALUE),
    Name("jax._src.sharding_impls", "GSPMDSharding", CLASS),
    Name("jax._src.sharding_impls", "GSPMDSharding.get_replicated", CALLABLE),
    Name("jax._src.sharding_impls", "UnspecifiedValue", CLASS),
    Name("jax._src.sharding_impls", "physical_sharding", CALLABLE),
    Name("jax._src.source_info_util", "register_exclusion", CALLABLE),
    Name("jax._src.stages", "Compiled.call", CALLABLE),
    Name("jax._src.traceback_util", "api_boundary", CALLABLE),
    Name("jax._src.traceback_util", "register_exclusion", CALLABLE),
    Name("jax._src.tree_util", "_registry", VALUE),
    Name("jax._src.tree_util", "dispatch_registry", VALUE),
    Name("jax._src.tree_util", "tree_flatten", CALLABLE),
    Name("jax._src.tree_util", "tree_leaves", CALLABLE),
    Name("jax._src.tree_util", "tree_unflatten", CALLABLE),
    Name("jax._src.util", "fun_qual_name", CALLABLE),
    Name("jax._src.util", "register_cache", CALLABLE),
]

# The states of JAX's jit key beyond its trace context (`fastpjit._jax.jit_key_states`), by
# line. The Rust dispatcher keys a call by the whole trace context and by these; a state that JAX
# adds to its jit key must be read too, or a call under it could take another's executable.
JIT_KEY_ONLY_STATES = {
    "0.10": ("trace_state", "device_context", "jax_optimization_level", "jax_memory_fitting_level"),
    "0.11": (
        "trace_state",
        "device_context",
        "jax_optimization_level",
        "jax_memory_fitting_level",
        "jax_pallas_auto_assign_collective_ids",
        "jax_pallas_auto_assign_collective_ids_limit",
    ),
}

# The attributes and methods that Rust reads or calls by name on JAX's objects (`intern!`,
# `getattr`, `call_method`), each checked on a tiny example by `test_rust_calls_by_name`.
RUST_CALLS_BY_NAME = (
    "execute_sharded",
    "str_short",
    "node_data",
    "children",
    "num_nodes",
    "num_leaves",
    "unflatten",
    "partitions",
    "unreduced",
    "UNCONSTRAINED",
    "mesh",
    "spec",
    "manual_axes",
    "axis_names",
    "axis_sizes",
    "devices",
    "device_set",
    "num_devices",
    "is_fully_replicated",
    "client",
    "process_index",
    "platform",
    "aval",
    "dtype",
    "shape",
    "weak_type",
    "ndim",
    "nbytes",
    "jax_enable_x64",
    "host_to_device",
    "device_to_device",
)
# Names Rust reads by `intern!` from Python's or numpy's own objects: no JAX assumption.
RUST_NAMES_NOT_JAX = frozenset(
    (
        "builtins",
        "sorted",
        "view",
        "reshape",
        "ravel",
        "tolist",
        "astype",
        "__array__",
        "uint8",
    )
)


def load_module(dotted: str) -> Any:
    """The module at `dotted`, imported, or an attribute of its parent (jaxlib's `_jax` is)."""
    try:
        return importlib.import_module(dotted)
    except ImportError:
        parent, _, child = dotted.rpartition(".")
        return getattr(importlib.import_module(parent), child)


def resolve(name: Name) -> tuple[Any, Any, str]:
    """(the object that holds the last attribute, the attribute as stored there, its name)."""
    owner: Any = load_module(name.module)
    *parents, last = name.path.split(".")
    for part in parents:
        owner = getattr(owner, part)
    return owner, inspect.getattr_static(owner, last), last


def kind_problem(name: Name) -> str | None:
    """Why `name` no longer is what fastpjit assumes, or None."""
    try:
        owner, found, last = resolve(name)
    except (ImportError, AttributeError) as err:
        return f"gone ({type(err).__name__}: {err})"
    if name.kind == CALLABLE:
        value = getattr(owner, last)
        return None if callable(value) else f"not callable: {type(value).__name__}"
    if name.kind == CLASS:
        return None if isinstance(found, type) else f"not a class: {type(found).__name__}"
    if name.kind == GETTER:
        return (
            None
            if isinstance(found, property) and found.fget is not None
            else (f"not a property with a getter: {type(found).__name__}")
        )
    if name.kind == METHOD:
        return (
            None
            if callable(found) and not isinstance(found, property)
            else (f"not a method: {type(found).__name__}")
        )
    if name.kind == MEMBER:
        return None if isinstance(found, owner) else f"not a member of {owner}: {found!r}"
    return None


def test_jax_is_a_tested_release_of_the_line_chosen():
    assert jax.__version__ == jaxlib.__version__ in TESTED[line.CURRENT], (
        f"fastpjit's JAX assumptions were checked on {TESTED}; this is jax {jax.__version__}, "
        f"jaxlib {jaxlib.__version__} on line {line.CURRENT}: review this file's lists"
    )
    assert line.supported(jax.__version__, jaxlib.__version__, jaxlib_extension_version)


# (jax and jaxlib, their extension version, whether fastpjit supports them): the extension
# versions are those of the releases (0.11.0 had 477, 0.11.1 480).
RELEASES = [
    ("0.10.1", 465, False),
    ("0.10.2", 467, True),
    ("0.11.0", 477, False),
    ("0.11.1", 480, False),
    ("0.11.2", 495, True),
    ("0.12.0", 505, True),
    ("0.12.0.1", 505, True),
    ("0.12.5", 530, True),
    ("0.13.0", 540, False),
    ("0.13.0.dev20261101", 540, False),
]


@pytest.mark.parametrize(("version", "extension", "supported"), RELEASES)
def test_the_supported_range(version, extension, supported):
    assert line.supported(version, version, extension) is supported
    # jax 0.12 allows jaxlib 0.11.2; a jax of one line and a jaxlib of the other is refused.
    assert line.supported("0.12.0", "0.11.2", 495)
    assert not line.supported("0.10.2", "0.11.2", 495)
    assert not line.supported("0.11.2", "0.10.2", 467)


def test_the_dependencies_resolve_to_the_supported_range():
    # `pip install fastpjit` on each Python gets a JAX that fastpjit imports beside.
    from packaging.requirements import Requirement

    deps = [
        Requirement(text)
        for text in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    ]
    for python in ("3.11", "3.12", "3.13"):
        env = {"python_version": python, "python_full_version": f"{python}.0"}
        for name in ("jax", "jaxlib"):
            (spec,) = [d.specifier for d in deps if d.name == name and d.marker.evaluate(env)]
            for version, _, supported in RELEASES:
                # JAX 0.11 and newer need CPython 3.12; there the newest line resolves.
                of_its_line = (line.release(version) < (0, 11)) == (python == "3.11")
                allowed = spec.contains(version, prereleases=True)
                assert allowed == (supported and of_its_line), (python, name, version, spec)


@pytest.mark.subprocess
@pytest.mark.timeout(120)
def test_an_unsupported_jax_is_refused_at_import_naming_the_supported_versions():
    script = textwrap.dedent(
        """
        import jax
        jax.__version__ = "0.13.0"
        try:
            import fastpjit
        except ImportError as error:
            print(error)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=110
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "this is jax 0.13.0" in done.stdout and line.SUPPORTED in done.stdout, done.stdout


@pytest.mark.parametrize("name", PRIVATE_NAMES, ids=str)
def test_private_name_exists_with_its_kind(name):
    problem = kind_problem(name)
    if line.CURRENT in name.lines:
        assert problem is None, f"JAX assumption broken: {name} is {problem}"
    else:  # The name of another line: the adapter's choice is needed.
        assert problem is not None and problem.startswith("gone"), f"{name} is here too"


def _boundary_module_attributes() -> set[tuple[str, str]]:
    """(module, attribute) for every attribute that fastpjit._jax reads of a private module
    or class it imports."""
    used = set()
    for path in BOUNDARY.glob("*.py"):
        tree = ast.parse(path.read_text())
        aliases = {}
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and (node.module.startswith(("jax._src", "jaxlib")))
            ):
                for alias in node.names:
                    module = f"{node.module}.{alias.name}"
                    if _is_module(module):
                        aliases[alias.asname or alias.name] = (module, "")
                    else:  # a class imported from its module: reads are of the class
                        aliases[alias.asname or alias.name] = (node.module, alias.name + ".")
                        used.add((node.module, alias.name))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
            ):
                module, prefix = aliases[node.value.id]
                used.add((module, prefix + node.attr))
    return used


def _is_module(dotted: str) -> bool:
    try:
        return isinstance(load_module(dotted), types.ModuleType)
    except (ImportError, AttributeError):
        return False


def test_the_private_name_list_is_complete():
    # Every private module attribute that the boundary reads is in PRIVATE_NAMES (at least its
    # first part: `HloSharding` for `HloSharding.from_string`).
    listed = {(n.module, n.path) for n in PRIVATE_NAMES}
    prefixes = {(n.module, n.path.split(".")[0]) for n in PRIVATE_NAMES}
    missing = sorted(
        (module, attr)
        for module, attr in _boundary_module_attributes()
        if (module, attr) not in listed
        and (module, attr.split(".")[0]) not in prefixes
        and (module, attr.rsplit(".", 1)[0]) not in listed
    )
    assert not missing, f"private names that fastpjit._jax uses but PRIVATE_NAMES lacks: {missing}"


def test_no_private_jax_name_outside_the_boundary():
    package = BOUNDARY.parent
    offenders = [
        f"{path.relative_to(package)}:{i}"
        for path in package.glob("*.py")
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"^\s*(from|import)\s+(jax\._src|jaxlib)\b", line)
    ]
    assert not offenders, f"private JAX imports outside fastpjit._jax: {offenders}"


def _rust_reads_of_the_boundary() -> set[str]:
    """The names that the Rust sources fetch from `fastpjit._jax` (`jax::private`)."""
    text = "\n".join(p.read_text() for p in RUST_SOURCES.rglob("*.rs"))
    found = set(
        re.findall(r"\b(?:get|attribute|type_attribute|interned)\(\s*jax,\s*\"(\w+)\"", text)
    )
    found |= set(re.findall(r"\bjax\s*\.getattr\(\s*\"(\w+)\"", text))
    found |= set(re.findall(r"private\(py\)\?\s*\.getattr\(intern!\(py, \"(\w+)\"\)", text))
    return found


def test_every_name_that_rust_reads_is_exported():
    reads = _rust_reads_of_the_boundary()
    assert len(reads) > 20, f"the Rust handle tables were not found: {sorted(reads)}"
    exported = set(_jax.__all__)
    assert reads <= exported, f"names Rust reads that fastpjit._jax lacks: {reads - exported}"
    text = "\n".join(p.read_text() for p in RUST_SOURCES.rglob("*.rs"))
    unread = [n for n in _jax.__all__ if f'"{n}"' not in text]
    assert not unread, f"fastpjit._jax exports names that Rust no longer reads: {unread}"


def _rust_interned_names() -> set[str]:
    """The attribute and method names in `handles.rs`'s `names!` table, and any `intern!`."""
    text = "\n".join(p.read_text() for p in RUST_SOURCES.rglob("*.rs"))
    table = re.search(r"^names! \{\n(.*?)^\}", text, re.S | re.M)
    assert table, "the names! table of rust/bindings/src/handles.rs was not found"
    listed = set(re.findall(r"^\s*(\w+),\s*$", table.group(1), re.M))
    return listed | set(re.findall(r"intern!\(py, \"(\w+)\"\)", text))


def test_every_name_that_rust_interns_is_listed():
    interned = _rust_interned_names()
    assert {"execute_sharded", "node_data", "partitions"} <= interned
    unlisted = interned - set(RUST_CALLS_BY_NAME) - RUST_NAMES_NOT_JAX - set(_jax.__all__)
    assert not unlisted, f"names Rust calls by name that RUST_CALLS_BY_NAME lacks: {unlisted}"


def _jit_key_only_states_in_jax_s_sources() -> tuple[str, ...]:
    """The config states that JAX's sources put in the jit key and not in the trace context,
    by name, in the order of the files that define them."""
    found = []
    for path in sorted(pathlib.Path(jax.__file__).parent.joinpath("_src").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            keywords = {k.arg: k.value for k in node.keywords}
            in_key, in_trace = (
                isinstance(value, ast.Constant) and value.value is True
                for value in (
                    keywords.get("include_in_jit_key"),
                    keywords.get("include_in_trace_context"),
                )
            )
            if in_key and not in_trace:
                name = node.args[0] if node.args else keywords["name"]
                assert isinstance(name, ast.Constant), ast.unparse(node)
                found.append(name.value)
    return tuple(found)


@pytest.mark.slow
def test_jit_key_states_are_the_ones_the_dispatcher_reads():
    expected = JIT_KEY_ONLY_STATES[line.CURRENT]
    assert tuple(state.name for state in _jax.jit_key_states) == expected
    in_sources = _jit_key_only_states_in_jax_s_sources()
    assert sorted(in_sources) == sorted(expected), (
        "JAX's jit key changed: review fastpjit._jax.rust_handles.jit_key_states and "
        f"JIT_KEY_ONLY_STATES; added {set(in_sources) - set(expected)}, "
        f"removed {set(expected) - set(in_sources)}"
    )
    from jax._src import config

    key = _jax.trace_context()
    assert isinstance(key, tuple) and len(key) == len(config.trace_context_names())
    with jax.disable_jit():
        assert _jax.trace_context()[_jax.DISABLE_JIT_INDEX] is True
    assert _jax.trace_context()[_jax.DISABLE_JIT_INDEX] is False
    for state in _jax.jit_key_states:
        _jax.config_value(state)  # a C++ state whose value the getter reads
    assert _jax.config_value(_jax.post_hook_state) is None  # no NaN/inf checks


def test_rust_handles_have_their_kinds():
    assert isinstance(_jax.ArrayImpl, type)
    for getter in (
        _jax.array_aval,
        _jax.array_sharding,
        _jax.array_committed,
        _jax.array_single_device_arrays,
        _jax.config_value,
    ):
        assert callable(getter)
    for member in (_jax.HOST_BUFFER_ZERO_COPY, _jax.HOST_BUFFER_COPY, _jax.TRANSFER_GUARD_ALLOW):
        assert isinstance(member, enum.Enum), member
    assert isinstance(_jax.DISABLE_JIT_INDEX, int)
    for name in (_jax.ARRAY_TO_HOST, _jax.ARRAY_HOST_VALUE):
        assert inspect.getattr_static(_jax.ArrayImpl, name, None) is not None, name


def test_array_getters_read_what_the_public_properties_give():
    sharding = NamedSharding(Mesh(np.array(DEVICES), ("x",)), P("x"))
    x = jax.device_put(np.arange(16, dtype=np.float32), sharding)
    assert _jax.array_aval(x) == x.aval
    assert _jax.array_sharding(x) == x.sharding
    assert _jax.array_committed(x) is True and x.committed
    assert _jax.array_is_deleted(x) is False
    shards = _jax.array_single_device_arrays(x)
    assert [s.devices() for s in shards] == [{d} for d in sharding._device_assignment]
    assert x.aval.str_short() == "float32[16]"  # how JAX's donation error names an array
    rewrapped = _jax.array_rewrap(x, x.aval, x.sharding)
    np.testing.assert_array_equal(np.asarray(rewrapped), np.arange(16))
    # jax 0.10.2 raises its own error for a donated array, which keeps its size where a deleted
    # one does not; from 0.11.2 JAX raises the deleted array's error for both.
    donated = jax.device_put(np.arange(16, dtype=np.float32), sharding)
    jax.jit(lambda a: a + 1, donate_argnums=0)(donated)
    assert donated.is_deleted() and _jax.array_was_donated(donated) is ON_0_10
    replicated = jax.device_put(np.ones(4, np.float32), SingleDeviceSharding(DEVICES[0]))
    value, did_copy = getattr(replicated, _jax.ARRAY_TO_HOST)()
    assert isinstance(value, np.ndarray) and isinstance(did_copy, bool)
    # Rust caches a host value where np.asarray looks for one.
    assert getattr(x, _jax.ARRAY_HOST_VALUE) is None
    cached = np.arange(16, dtype=np.float32)
    setattr(x, _jax.ARRAY_HOST_VALUE, cached)
    assert np.asarray(x) is cached
    _jax.copy_to_host_async(replicated)
    replicated.delete()
    assert _jax.array_is_deleted(replicated) and not _jax.array_was_donated(replicated)


@pytest.mark.parametrize("shard", [0, 3])
def test_is_deleted_of_an_array_over_devices_looks_at_its_first_shard_alone(shard):
    # The liveness check before an execution across devices is jaxlib's, jax.jit's as
    # fastpjit's: docs/serving.md says what it sees, and that a jaxlib which looks further
    # changes that.
    sharding = NamedSharding(Mesh(np.array(DEVICES), ("x",)), P("x"))
    x = jax.device_put(np.arange(16, dtype=np.float32), sharding)
    x.addressable_shards[shard].data.delete()
    assert _jax.array_is_deleted(x) is (shard == 0)


def test_transfer_steps_that_rust_calls():
    sharding = NamedSharding(Mesh(np.array(DEVICES), ("x",)), P("x"))
    host = np.arange(16, dtype=np.float32)
    aval = _jax.device_put_aval((16,), np.dtype(np.float32), False, sharding)
    assert aval == jax.device_put(host, sharding).aval
    placed = _jax.placement_sharding(sharding, 1)
    assert placed.is_equivalent_to(sharding, 1)
    shards = [host[i * 2 : (i + 1) * 2] for i in range(len(DEVICES))]
    # As Rust calls it: aval, sharding, shards, devices, committed, force copy, semantics.
    x = _jax.batched_device_put(
        aval, placed, shards, list(placed._device_assignment), True, False, _jax.HOST_BUFFER_COPY
    )
    np.testing.assert_array_equal(np.asarray(x), host)
    assert _jax.canonical_dtype(np.float64) == np.float32  # no x64
    assert _jax.python_scalar_dtype(int) == np.int32
    with pytest.raises(TypeError):
        _jax.canonical_dtype(object)
    # A copy to other devices: what array_input hands batched_copy.
    other = NamedSharding(Mesh(np.array(DEVICES[::-1]), ("x",)), P("x"))
    how, copy_args = _jax.array_input(x.sharding, other, 1)
    assert how == "copy" and copy_args is not None
    (moved,) = _jax.batched_copy([x], *copy_args)
    assert moved.sharding == other
    np.testing.assert_array_equal(np.asarray(moved), host)
    assert _jax.array_input(x.sharding, x.sharding, 1) == ("pass", None)
    moved = _jax.shard_arg(x, SingleDeviceSharding(DEVICES[1]))
    assert moved.sharding == SingleDeviceSharding(DEVICES[1])


def test_the_transfer_guard_reads_as_rust_reads_it():
    thread, process = _jax.transfer_guard_thread_state(), _jax.transfer_guard_global_state
    for direction in ("host_to_device", "device_to_device", "device_to_host"):
        assert hasattr(thread, direction) and hasattr(process, direction), direction
    with jax.transfer_guard("allow"):
        assert _jax.transfer_guard_thread_state().host_to_device == _jax.TRANSFER_GUARD_ALLOW
    with jax.transfer_guard("disallow"):
        assert _jax.transfer_guard_thread_state().host_to_device != _jax.TRANSFER_GUARD_ALLOW


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class _Point:
    x: Any
    y: Any
    label: str = dataclasses.field(metadata={"static": True}, default="p")


def test_pytree_internals_that_the_dispatcher_reads():
    assert _jax.dataclass_fields(_Point) == (("x", "y"), ("label",))
    assert _jax.dataclass_fields(dict) is None
    children, _ = _jax.flatten_one_level_for_dispatch(_Point(1, 2))  # (children, aux data)
    assert list(children) == [1, 2]
    treedef = jax.tree.structure({"b": (1, [2]), "a": None})
    assert treedef.node_data() == (dict, ["a", "b"])
    assert [c.num_nodes for c in treedef.children()] == [1, 4]
    assert (treedef.num_nodes, treedef.num_leaves) == (6, 2)
    assert jax.tree.structure(1).node_data() is None  # a leaf
    assert jax.tree.structure((1, 2)).node_data() == (tuple, None)
    assert treedef.unflatten([1, 2]) == {"a": None, "b": (1, [2])}


def test_the_sharding_attributes_that_rust_reads():
    mesh = Mesh(np.array(DEVICES).reshape(2, 4), ("x", "y"))
    spec = P(("x", "y"), None, P.UNCONSTRAINED)
    assert spec.partitions == (("x", "y"), None, P.UNCONSTRAINED)
    assert P("x", unreduced={"y"}).unreduced == frozenset({"y"})
    sharding = NamedSharding(mesh, P("x"))
    assert sharding.mesh is mesh and sharding.spec == P("x")
    assert (mesh.axis_names, mesh.axis_sizes, mesh.manual_axes) == (("x", "y"), (2, 4), ())
    assert mesh.devices.ravel().tolist() == list(DEVICES)
    assert sharding._logical_device_ids is None
    assert AbstractMesh((2, 4), ("x", "y")).axis_sizes == (2, 4)
    assert sharding.device_set == set(DEVICES) and sharding.num_devices == 8
    assert not sharding.is_fully_replicated
    text, devices = _jax.hlo_parts(sharding, 2)
    assert text == "{devices=[2,1,4]<=[8] last_tile_dim_replicate}" and len(devices) == 8
    device = DEVICES[0]
    assert device.client.process_index() == device.process_index == 0
    assert isinstance(device.platform, str)
    assert isinstance(jax.config.jax_enable_x64, bool)


def test_an_executable_runs_as_the_dispatcher_runs_it():
    # execute_sharded on placed inputs, then consume_with_handlers: the cached call's path.
    sharding = NamedSharding(Mesh(np.array(DEVICES), ("x",)), P("x"))
    x = jax.device_put(np.arange(16, dtype=np.float32), sharding)
    jitted = jax.jit(lambda a: a * 2)
    miss = jit_miss.jit_cache_miss(jitted, (x,), {})
    fast = miss.fast_path
    assert fast is not None, miss.jax_reason
    results = fast.executable.execute_sharded([x])
    (out,) = _jax.consume_with_handlers(results, list(fast.out_handlers))
    np.testing.assert_array_equal(np.asarray(out), np.arange(16) * 2)
    assert out.sharding == sharding
    _jax.collect_garbage()


def test_the_internals_of_a_jit_function_that_a_miss_reads():
    jitted = jax.jit(lambda a, n: a * n, static_argnums=1, donate_argnums=0)
    assert callable(jitted._fun)
    info = jitted._jit_info
    assert (tuple(info.static_argnums), tuple(info.donate_argnums)) == ((1,), (0,))
    assert (tuple(info.static_argnames), tuple(info.donate_argnames)) == (("n",), ("a",))
    lowered = jax.jit(lambda a: a + 1).lower(jnp.ones(8))
    computation = lowered._lowering
    assert computation._executable is None and computation._name and computation._hlo
    assert len(computation._device_list) == 1
    assert isinstance(computation._compiler_options_kvs, tuple)
    expected = {
        "host_callbacks",
        "ordered_effects",
        "unordered_effects",
        "in_layouts",
        "out_layouts",
        "mut",
        "shape_poly_state",
        "global_in_avals",
        "global_out_avals",
        "in_shardings",
        "out_shardings",
        "backend",
        "tuple_args",
        "committed",
        "keepalive",
        "kept_var_idx",
        "intermediate_shardings",
        "context_mesh",
        "all_args_info",
    }
    assert expected <= set(computation.compile_args), expected - set(computation.compile_args)
    compiled = lowered.compile()
    executable = compiled._executable
    for name in (
        "xla_executable",
        "unsafe_call",
        "in_avals",
        "shard_const_args",
        "_mut",
        "_kept_var_idx",
        "_in_shardings",
        "_out_shardings",
        "_dispatch_in_layouts",
    ):
        assert hasattr(executable, name), name
    for name in (
        "in_handler",
        "kept_var_idx",
        "mut",
        "out_handler",
        "has_unordered_effects",
        "has_host_callbacks",
    ):
        assert hasattr(executable.unsafe_call, name), name
    for name in ("const_args", "is_high", "out_tree"):
        assert hasattr(compiled._params, name), name


def test_pmap_keeps_its_parameter_inference_in_a_closure():
    infer_params = jit_miss._closure_variable(jax.pmap(lambda a: a), "infer_params")
    assert "static_broadcasted_tuple" in infer_params.__code__.co_freevars
    result = infer_params(np.ones((8, 2), np.float32))
    assert len(result) == 7  # cached, jitted, args_flat, _, _, process_count, trace_clean
