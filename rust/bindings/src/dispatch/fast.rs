//! The identity check that lets a repeated call skip keying: positional arguments only (bare
//! `jax.Array`s, or pytrees of them in the same tree), whose leaves carry the very aval and
//! sharding objects of a call already keyed, with the same commitment, under a jit key
//! unchanged item by item.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::handles::Handles;
use super::signature::{LeafKind, Signature};

pub struct FastKey {
    avals: Vec<Py<PyAny>>,
    shardings: Vec<Py<PyAny>>,
    committed: Vec<bool>,
    context: Py<PyTuple>,
    /// Whether each leaf's sharding is the executable's input sharding (else JAX moves it).
    pub direct: Vec<bool>,
    /// The tree of `(args, {})` as JAX's dispatch flattens it; `None` when the leaves are the
    /// positional arguments themselves.
    pub treedef: Option<Py<PyAny>>,
}

impl FastKey {
    /// The fast key of a call keyed by `signature`, if the call was positional only with
    /// array leaves; `treedef` as for the field. `in_sharding(i)` is the executable's
    /// sharding for leaf `i`, if it takes it.
    pub fn new(
        py: Python<'_>,
        signature: &Signature,
        treedef: Option<Py<PyAny>>,
        in_sharding: impl Fn(usize) -> Option<Py<PyAny>>,
    ) -> PyResult<Option<Self>> {
        if !signature.positional_only {
            return Ok(None);
        }
        let Ok(context) = signature.context.obj.bind(py).cast::<PyTuple>() else {
            return Ok(None);
        };
        let mut key = Self {
            avals: Vec::new(),
            shardings: Vec::new(),
            committed: Vec::new(),
            context: context.clone().unbind(),
            direct: Vec::new(),
            treedef,
        };
        for (i, leaf) in signature.leaves.iter().enumerate() {
            let LeafKind::Array {
                sharding,
                committed,
                aval,
            } = &leaf.kind
            else {
                return Ok(None);
            };
            key.avals.push(aval.clone_ref(py));
            key.shardings.push(sharding.obj.clone_ref(py));
            key.committed.push(*committed);
            key.direct.push(match in_sharding(i) {
                Some(s) => s.is(&sharding.obj) || s.bind(py).eq(sharding.obj.bind(py))?,
                None => true,
            });
        }
        Ok(Some(key))
    }

    /// Whether the positional `args` of a call without keywords match this key by identity.
    pub fn matches(
        &self,
        py: Python<'_>,
        h: &Handles,
        args: &Bound<'_, PyTuple>,
    ) -> PyResult<bool> {
        if args.len() != self.avals.len() {
            return Ok(false);
        }
        let array_type = h.array_impl.bind(py);
        for (i, arg) in args.iter().enumerate() {
            if !arg.get_type().is(array_type)
                || !arg.getattr(intern!(py, "aval"))?.is(&self.avals[i])
                || !arg.getattr(intern!(py, "sharding"))?.is(&self.shardings[i])
                || arg.getattr(intern!(py, "committed"))?.is_truthy()? != self.committed[i]
            {
                return Ok(false);
            }
        }
        h.jit_key_is(py, self.context.bind(py))
    }
}
