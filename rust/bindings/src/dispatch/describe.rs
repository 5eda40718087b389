//! A call signature described item by item (see the core's `describe`): the texts that only
//! Python has (reprs, a dtype's name), and the jit key's items by name.

use fastpjit_core::dispatch::describe::{
    roots, static_paths, Aspect, Description, LeafTexts, JIT_KEY,
};
use fastpjit_core::dispatch::ArgSignature;
use numpy::npyffi::PY_ARRAY_API;
use pyo3::prelude::*;

use super::signature::CallSignature;
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
        ArgSignature::Host { dtype, .. } => {
            // SAFETY: numpy's API is loaded (the dispatcher read this leaf through it), and
            // the descriptor comes back owned, or null with the error set.
            let descr = unsafe {
                let descr = PY_ARRAY_API.PyArray_DescrFromType(py, dtype.num);
                Bound::<PyAny>::from_owned_ptr_or_err(py, descr.cast())?
            };
            LeafTexts {
                dtype: descr.to_string(),
                sharding: String::new(),
            }
        }
        ArgSignature::Scalar(_) => LeafTexts::default(),
    })
}
