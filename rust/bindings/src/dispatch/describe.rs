//! A call signature described item by item, as `jax_jit.h`'s `CallSignature::DebugString`:
//! each leaf by its path, the static arguments, the tree, and every item of the jit key.
//! `explain`, `no_recompiles` and warm starts compare these descriptions, so that a miss names
//! what differs from a cached signature, whatever keyed it.

use fastpjit_core::dispatch::route::is_static_position;
use fastpjit_core::dispatch::{ArgSignature, HostKind};
use numpy::npyffi::PY_ARRAY_API;
use pyo3::prelude::*;

use super::signature::CallSignature;
use crate::handles::Handles;

/// One item of a description: what it is (a leaf's path, `tree`, `jit key: jax_enable_x64`),
/// and its value in words.
pub type Item = (String, String);

/// The description of `signature`, a signature of a function whose static positions are
/// `argnums`.
pub fn describe(
    py: Python<'_>,
    h: &Handles,
    signature: &CallSignature,
    argnums: &[isize],
) -> PyResult<Vec<Item>> {
    let num_args = signature.num_args;
    let is_static = |i: usize| is_static_position(argnums, i, num_args);
    let kwargs =
        |name: &Py<PyAny>| -> PyResult<String> { Ok(format!("kwargs[{}]", name.bind(py).repr()?)) };
    let mut roots: Vec<String> = (0..num_args)
        .filter(|&i| !is_static(i))
        .map(|i| format!("args[{i}]"))
        .collect();
    for name in &signature.kwnames {
        roots.push(kwargs(name)?);
    }
    let (tree, paths) = signature.tree.describe(py, &roots)?;
    let mut items = Vec::with_capacity(paths.len() + 2);
    for (path, leaf) in paths.into_iter().zip(&signature.leaves) {
        items.push((path, leaf_text(py, leaf)?));
    }
    let static_paths = (0..num_args)
        .filter(|&i| is_static(i))
        .map(|i| Ok(format!("args[{i}]")))
        .chain(signature.static_names.iter().map(kwargs));
    for (path, value) in static_paths.zip(&signature.statics) {
        let value = value.bind(py);
        let text = format!(
            "static {} ({})",
            value.repr()?,
            value.get_type().qualname()?
        );
        items.push((path?, text));
    }
    items.push(("tree".to_owned(), tree));
    for (name, value) in h.jit_key_names.iter().zip(signature.context.items(py)) {
        items.push((format!("jit key: {name}"), value.repr()?.to_string()));
    }
    Ok(items)
}

/// A leaf in words: `jax.Array f32[4] (weak type), committed, on NamedSharding(...)`.
fn leaf_text(py: Python<'_>, leaf: &ArgSignature<Py<PyAny>>) -> PyResult<String> {
    Ok(match leaf {
        ArgSignature::Array {
            aval,
            value,
            sharding,
            committed,
            ..
        } => {
            let aval = aval.bind(py).call_method0("str_short")?;
            let weak = if value.weak_type { " (weak type)" } else { "" };
            let committed = if *committed {
                "committed"
            } else {
                "uncommitted"
            };
            format!(
                "jax.Array {aval}{weak}, {committed}, on {}",
                sharding.bind(py).repr()?
            )
        }
        ArgSignature::Host { dtype, kind, shape } => {
            // SAFETY: numpy's API is loaded (the dispatcher read this leaf through it), and
            // the descriptor comes back owned, or null with the error set.
            let descr = unsafe {
                let descr = PY_ARRAY_API.PyArray_DescrFromType(py, dtype.num);
                Bound::from_owned_ptr_or_err(py, descr.cast())?
            };
            match kind {
                HostKind::Array => format!("numpy array {descr}{shape:?}"),
                HostKind::Scalar => format!("numpy scalar {descr}"),
            }
        }
        ArgSignature::Scalar(kind) => {
            let weak = if kind.weak_type() { " (weak type)" } else { "" };
            format!("Python {kind:?}{weak}").to_lowercase()
        }
    })
}
