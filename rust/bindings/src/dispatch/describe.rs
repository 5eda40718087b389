//! A call signature described item by item (see the core's `describe`): the texts that only
//! Python has (reprs, an aval's short form, a dtype's name), and the jit key's items by name.

use fastpjit_core::dispatch::describe::{roots, static_paths, Item, LeafTexts};
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
) -> PyResult<Vec<Item>> {
    let reprs = |names: &[Py<PyAny>]| -> PyResult<Vec<String>> {
        names
            .iter()
            .map(|n| Ok(n.bind(py).repr()?.to_string()))
            .collect()
    };
    let num_args = signature.num_args;
    let dynamic = roots(num_args, argnums, &reprs(&signature.kwnames)?);
    let (tree, paths) = signature.tree.describe(py, &dynamic)?;
    let mut items = Vec::with_capacity(paths.len() + 2);
    for (path, leaf) in paths.into_iter().zip(&signature.leaves) {
        items.push((path, leaf.describe(&leaf_texts(py, leaf)?)));
    }
    let statics = static_paths(num_args, argnums, &reprs(&signature.static_names)?);
    for (path, value) in statics.into_iter().zip(&signature.statics) {
        let value = value.bind(py);
        let text = format!(
            "static {} ({})",
            value.repr()?,
            value.get_type().qualname()?
        );
        items.push((path, text));
    }
    items.push(("tree".to_owned(), tree));
    for (name, value) in h.jit_key_names.iter().zip(signature.context.items(py)) {
        items.push((format!("jit key: {name}"), value.repr()?.to_string()));
    }
    Ok(items)
}

/// What only Python says of a leaf: an array's aval and sharding, a host value's dtype.
fn leaf_texts(py: Python<'_>, leaf: &ArgSignature<Py<PyAny>>) -> PyResult<LeafTexts> {
    Ok(match leaf {
        ArgSignature::Array { aval, sharding, .. } => LeafTexts {
            array: Some((
                aval.bind(py).call_method0("str_short")?.to_string(),
                sharding.bind(py).repr()?.to_string(),
            )),
            dtype: None,
        },
        ArgSignature::Host { dtype, .. } => {
            // SAFETY: numpy's API is loaded (the dispatcher read this leaf through it), and
            // the descriptor comes back owned, or null with the error set.
            let descr = unsafe {
                let descr = PY_ARRAY_API.PyArray_DescrFromType(py, dtype.num);
                Bound::<PyAny>::from_owned_ptr_or_err(py, descr.cast())?
            };
            LeafTexts {
                array: None,
                dtype: Some(descr.to_string()),
            }
        }
        ArgSignature::Scalar(_) => LeafTexts {
            array: None,
            dtype: None,
        },
    })
}
