//! A call signature described item by item (see the core's `describe`): the texts that only
//! Python has (reprs, a dtype's name), and the jit key's items by name; and the signature as
//! plain Python data, which a warm-start record writes.

use fastpjit_core::dispatch::describe::{
    roots, static_paths, Aspect, Description, LeafTexts, JIT_KEY,
};
use fastpjit_core::dispatch::route::is_static_position;
use fastpjit_core::dispatch::tree::Nested;
use fastpjit_core::dispatch::{ArgSignature, HostKind};
use numpy::npyffi::PY_ARRAY_API;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::signature::CallSignature;
use super::tree::{Node, PyHandles};
use crate::handles::Handles;

/// The description of `signature`, a signature of a function whose static positions are
/// `argnums`.
pub fn describe(
    py: Python<'_>,
    h: &Handles,
    signature: &CallSignature,
    argnums: &[isize],
) -> PyResult<Description> {
    let reprs = |names: &[Py<PyAny>]| -> PyResult<Vec<String>> {
        names
            .iter()
            .map(|n| Ok(n.bind(py).repr()?.to_string()))
            .collect()
    };
    let num_args = signature.num_args;
    let kwnames = reprs(&signature.kwnames)?;
    let static_names = reprs(&signature.static_names)?;
    let dynamic = roots(num_args, argnums, &kwnames);
    let (tree, paths) = signature.tree.describe(py, &dynamic)?;
    let mut out = Description::default();
    for (path, leaf) in paths.into_iter().zip(&signature.leaves) {
        out.push_leaf(path, leaf, &leaf_texts(py, leaf)?);
    }
    let statics = static_paths(num_args, argnums, &static_names);
    for (path, value) in statics.into_iter().zip(&signature.statics) {
        let value = value.bind(py);
        let text = format!("{} ({})", value.repr()?, value.get_type().qualname()?);
        out.push(path, Aspect::Static, text);
    }
    out.push("tree".to_owned(), Aspect::Tree, tree);
    if !(kwnames.is_empty() && static_names.is_empty()) {
        let names: Vec<String> = kwnames
            .into_iter()
            .chain(static_names.into_iter().map(|n| format!("{n} (static)")))
            .collect();
        out.push("keywords".to_owned(), Aspect::Keywords, names.join(", "));
    }
    for (name, value) in h.jit_key_names.iter().zip(signature.context.items(py)) {
        let text = value.repr()?.to_string();
        out.push(format!("{JIT_KEY}{name}"), Aspect::JitKey, text);
    }
    Ok(out)
}

/// What only Python says of a leaf: an array's dtype and sharding, a host value's dtype.
fn leaf_texts(py: Python<'_>, leaf: &ArgSignature<Py<PyAny>>) -> PyResult<LeafTexts> {
    Ok(match leaf {
        ArgSignature::Array { aval, sharding, .. } => LeafTexts {
            dtype: aval.bind(py).getattr("dtype")?.str()?.to_string(),
            sharding: sharding.bind(py).repr()?.to_string(),
        },
        ArgSignature::Host { dtype, .. } => LeafTexts {
            dtype: descr_of(py, dtype.num)?.to_string(),
            sharding: String::new(),
        },
        ArgSignature::Scalar(_) => LeafTexts::default(),
    })
}

/// `signature` as plain Python data, for a warm-start record to write what must cross
/// processes (see `fastpjit.warm_start.describe`): the positional arguments, each
/// `("static", value)` or a node, and the keyword ones as `(name, static or node)`. A node is
/// `("leaf", leaf)`, `("none",)`, `("tuple" | "list", [nodes])`, `("dict", [(key, node)])`,
/// `("registered", type, data, [nodes])` or `("dataclass", type, [nodes])`; a leaf is
/// `("array", shape, dtype, weak_type, committed, sharding)`, `("numpy", shape, dtype)`,
/// `("numpy_scalar", dtype)` or `("scalar", "bool" | "int" | "float" | "complex")`.
pub fn plain<'py>(
    py: Python<'py>,
    signature: &CallSignature,
    argnums: &[isize],
) -> PyResult<Bound<'py, PyTuple>> {
    let leaves = signature
        .leaves
        .iter()
        .map(|leaf| plain_leaf(py, leaf))
        .collect::<PyResult<Vec<_>>>()?;
    let mut roots = signature.tree.nested().into_iter();
    let mut statics = signature.statics.iter();
    let mut entry = |is_static: bool| -> PyResult<Bound<'py, PyAny>> {
        if is_static {
            let value = statics
                .next()
                .map_or_else(|| py.None(), |v| v.clone_ref(py));
            return Ok(("static", value).into_pyobject(py)?.into_any());
        }
        match roots.next() {
            Some(root) => plain_node(py, &root, &leaves),
            None => Ok(("none",).into_pyobject(py)?.into_any()),
        }
    };
    let num_args = signature.num_args;
    let positional = (0..num_args)
        .map(|i| entry(is_static_position(argnums, i, num_args)))
        .collect::<PyResult<Vec<_>>>()?;
    let mut keywords = Vec::new();
    for name in &signature.kwnames {
        keywords.push((name.bind(py).clone(), entry(false)?));
    }
    for name in &signature.static_names {
        keywords.push((name.bind(py).clone(), entry(true)?));
    }
    (positional, keywords).into_pyobject(py)
}

fn plain_node<'py>(
    py: Python<'py>,
    nested: &Nested<'_, PyHandles>,
    leaves: &[Bound<'py, PyAny>],
) -> PyResult<Bound<'py, PyAny>> {
    let (node, children) = match nested {
        Nested::Leaf(i) => {
            // A tree has as many leaves as its signature; a record is refused, never a panic.
            let leaf = leaves.get(*i).ok_or_else(|| {
                PyRuntimeError::new_err("a signature with fewer leaves than its tree")
            })?;
            return Ok(("leaf", leaf).into_pyobject(py)?.into_any());
        }
        Nested::Node(node, children) => (node, children),
    };
    let children = children
        .iter()
        .map(|child| plain_node(py, child, leaves))
        .collect::<PyResult<Vec<_>>>()?;
    Ok(match node {
        Node::Leaf | Node::Nothing => ("none",).into_pyobject(py)?.into_any(),
        Node::Tuple(_) => ("tuple", children).into_pyobject(py)?.into_any(),
        Node::List(_) => ("list", children).into_pyobject(py)?.into_any(),
        Node::Dict { keys, .. } => {
            let items: Vec<_> = keys.iter().map(|k| k.bind(py)).zip(children).collect();
            ("dict", items).into_pyobject(py)?.into_any()
        }
        Node::Registered { kind, data, .. } => ("registered", kind, data, children)
            .into_pyobject(py)?
            .into_any(),
        Node::Dataclass { kind, .. } => ("dataclass", kind, children).into_pyobject(py)?.into_any(),
    })
}

fn plain_leaf<'py>(py: Python<'py>, leaf: &ArgSignature<Py<PyAny>>) -> PyResult<Bound<'py, PyAny>> {
    Ok(match leaf {
        ArgSignature::Array {
            aval,
            value,
            sharding,
            committed,
            ..
        } => (
            "array",
            value.shape.to_vec(),
            aval.bind(py).getattr("dtype")?,
            value.weak_type,
            *committed,
            sharding,
        )
            .into_pyobject(py)?
            .into_any(),
        ArgSignature::Host { dtype, kind, shape } => {
            let descr = descr_of(py, dtype.num)?;
            match kind {
                HostKind::Array => ("numpy", shape.to_vec(), descr)
                    .into_pyobject(py)?
                    .into_any(),
                HostKind::Scalar => ("numpy_scalar", descr).into_pyobject(py)?.into_any(),
            }
        }
        ArgSignature::Scalar(kind) => ("scalar", kind.name()).into_pyobject(py)?.into_any(),
    })
}

/// numpy's dtype of the type number `num`.
fn descr_of(py: Python<'_>, num: i32) -> PyResult<Bound<'_, PyAny>> {
    // SAFETY: numpy's API is loaded (the dispatcher read a leaf of this dtype through it),
    // and the descriptor comes back owned, or null with the error set.
    unsafe {
        let descr = PY_ARRAY_API.PyArray_DescrFromType(py, num);
        Bound::<PyAny>::from_owned_ptr_or_err(py, descr.cast())
    }
}
