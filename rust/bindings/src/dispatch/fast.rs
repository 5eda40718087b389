//! The identity check that lets a repeated call skip keying. A call of positional arguments
//! only is flattened against the latest keyed call's tree (builtin tuples, lists, dicts and
//! None in Rust; custom pytree nodes by JAX's registry, whose tree must then be equal); it is
//! that call again when each array leaf carries the very aval and sharding objects it carried,
//! with the same commitment, each numpy leaf has the same dtype and shape, and JAX's jit key is
//! unchanged item by item.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use numpy::{PyArrayDescr, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyComplex, PyDict, PyFloat, PyInt, PyList, PyTuple};

use super::entry::Entry;
use super::handles::Handles;
use super::signature::{LeafKind, Signature, Tree};

/// The containers that Rust flattens as JAX's pytree registry does: exact tuples, lists and
/// dicts (whose leaves come in the order of their sorted keys), and None, which has no leaves.
pub enum Structure {
    Leaf,
    Nothing,
    Tuple(Vec<Structure>),
    List(Vec<Structure>),
    /// Keys in JAX's order, each with the structure under it.
    Dict(Vec<(Py<PyAny>, Structure)>),
}

impl Structure {
    /// The structure of `value` read as containers around leaves; every other object is a
    /// leaf here, which the caller checks against JAX's own flattening.
    fn of(value: &Bound<'_, PyAny>) -> PyResult<Option<Self>> {
        let py = value.py();
        let children = |items: Vec<Bound<'_, PyAny>>| -> PyResult<Option<Vec<Structure>>> {
            items.iter().map(Self::of).collect()
        };
        if value.is_none() {
            return Ok(Some(Self::Nothing));
        }
        if let Ok(tuple) = value.cast_exact::<PyTuple>() {
            return Ok(children(tuple.iter().collect())?.map(Self::Tuple));
        }
        if let Ok(list) = value.cast_exact::<PyList>() {
            return Ok(children(list.iter().collect())?.map(Self::List));
        }
        if let Ok(dict) = value.cast_exact::<PyDict>() {
            let sorted = py
                .import(intern!(py, "builtins"))?
                .getattr(intern!(py, "sorted"))?;
            // Keys that do not sort (mixed types) leave the call to JAX's flattening.
            let Ok(keys) = sorted.call1((dict.keys(),)) else {
                return Ok(None);
            };
            let mut entries = Vec::with_capacity(dict.len());
            for key in keys.try_iter()? {
                let key = key?;
                let Some(value) = dict.get_item(&key)? else {
                    return Ok(None);
                };
                let Some(structure) = Self::of(&value)? else {
                    return Ok(None);
                };
                entries.push((key.unbind(), structure));
            }
            return Ok(Some(Self::Dict(entries)));
        }
        Ok(Some(Self::Leaf))
    }

    /// Pushes the leaves of `value` onto `leaves` in JAX's order; false if `value` does not
    /// have this structure.
    fn flatten<'py>(
        &self,
        value: &Bound<'py, PyAny>,
        leaves: &mut Vec<Bound<'py, PyAny>>,
    ) -> PyResult<bool> {
        match self {
            Self::Leaf => {
                leaves.push(value.clone());
                Ok(true)
            }
            Self::Nothing => Ok(value.is_none()),
            Self::Tuple(children) => match value.cast_exact::<PyTuple>() {
                Ok(tuple) if tuple.len() == children.len() => {
                    flatten_all(children, tuple.iter(), leaves)
                }
                _ => Ok(false),
            },
            Self::List(children) => match value.cast_exact::<PyList>() {
                Ok(list) if list.len() == children.len() => {
                    flatten_all(children, list.iter(), leaves)
                }
                _ => Ok(false),
            },
            Self::Dict(entries) => {
                let Ok(dict) = value.cast_exact::<PyDict>() else {
                    return Ok(false);
                };
                if dict.len() != entries.len() {
                    return Ok(false);
                }
                // Equal sizes and every key present: the same key set, in JAX's sorted order.
                for (key, structure) in entries {
                    match dict.get_item(key.bind(value.py()))? {
                        Some(child) if structure.flatten(&child, leaves)? => {}
                        _ => return Ok(false),
                    }
                }
                Ok(true)
            }
        }
    }
}

impl Structure {
    /// A call `(args, kwargs)` flattened in Rust: its structure and leaves, when every leaf is
    /// a value that JAX's pytree registry can only hold as a leaf (a `jaxlib` array, a numpy
    /// array or scalar, a Python scalar); None when JAX's registry must flatten it.
    pub fn flatten_call<'py>(
        h: &Handles,
        args: &Bound<'py, PyTuple>,
        kwargs: &Bound<'py, PyDict>,
    ) -> PyResult<Option<(Self, Vec<Bound<'py, PyAny>>)>> {
        let py = args.py();
        let call = PyTuple::new(py, [args.as_any(), kwargs.as_any()])?;
        let Some(structure) = Self::of(call.as_any())? else {
            return Ok(None);
        };
        let mut leaves = Vec::new();
        if !structure.flatten(call.as_any(), &mut leaves)? {
            return Ok(None);
        }
        for leaf in &leaves {
            if !is_plain_leaf(h, leaf)? {
                return Ok(None);
            }
        }
        Ok(Some((structure, leaves)))
    }

    /// The structure of the positional arguments, in the structure of a call `(args, kwargs)`.
    pub fn call_args(&self) -> Option<&Self> {
        match self {
            Self::Tuple(parts) if parts.len() == 2 => parts.first(),
            _ => None,
        }
    }

    /// A hash of the structure, dict keys by their Python hash.
    pub fn key_hash(&self, py: Python<'_>, hasher: &mut impl Hasher) -> PyResult<()> {
        match self {
            Self::Leaf => 0u8.hash(hasher),
            Self::Nothing => 1u8.hash(hasher),
            Self::Tuple(children) | Self::List(children) => {
                u8::from(matches!(self, Self::Tuple(_))).hash(hasher);
                children.len().hash(hasher);
                for child in children {
                    child.key_hash(py, hasher)?;
                }
            }
            Self::Dict(entries) => {
                4u8.hash(hasher);
                entries.len().hash(hasher);
                for (key, child) in entries {
                    key.bind(py).hash()?.hash(hasher);
                    child.key_hash(py, hasher)?;
                }
            }
        }
        Ok(())
    }

    /// Whether two structures are the same tree (dict keys by identity, then equality).
    pub fn same(&self, py: Python<'_>, other: &Self) -> PyResult<bool> {
        let all_same = |a: &[Self], b: &[Self]| -> PyResult<bool> {
            if a.len() != b.len() {
                return Ok(false);
            }
            for (x, y) in a.iter().zip(b) {
                if !x.same(py, y)? {
                    return Ok(false);
                }
            }
            Ok(true)
        };
        match (self, other) {
            (Self::Leaf, Self::Leaf) | (Self::Nothing, Self::Nothing) => Ok(true),
            (Self::Tuple(a), Self::Tuple(b)) | (Self::List(a), Self::List(b)) => all_same(a, b),
            (Self::Dict(a), Self::Dict(b)) => {
                if a.len() != b.len() {
                    return Ok(false);
                }
                for ((ka, sa), (kb, sb)) in a.iter().zip(b) {
                    // As in JAX's treedefs, keys compare by equality.
                    let same_key = ka.is(kb) || ka.bind(py).eq(kb.bind(py))?;
                    if !same_key || !sa.same(py, sb)? {
                        return Ok(false);
                    }
                }
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}

/// Whether JAX's pytree registry can only hold `leaf` as a leaf: exact `jaxlib` arrays and
/// numpy arrays, numpy scalars, and Python scalars of the exact builtin types.
fn is_plain_leaf(h: &Handles, leaf: &Bound<'_, PyAny>) -> PyResult<bool> {
    let py = leaf.py();
    let kind = leaf.get_type_ptr();
    Ok(std::ptr::eq(kind, h.array_impl.as_ptr().cast())
        || std::ptr::eq(kind, h.ndarray.as_ptr().cast())
        || leaf.is_instance(h.numpy_scalar.bind(py))?
        || leaf.is_exact_instance_of::<PyBool>()
        || leaf.is_exact_instance_of::<PyInt>()
        || leaf.is_exact_instance_of::<PyFloat>()
        || leaf.is_exact_instance_of::<PyComplex>())
}

fn flatten_all<'py>(
    children: &[Structure],
    values: impl Iterator<Item = Bound<'py, PyAny>>,
    leaves: &mut Vec<Bound<'py, PyAny>>,
) -> PyResult<bool> {
    for (structure, value) in children.iter().zip(values) {
        if !structure.flatten(&value, leaves)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// What a repeat of the latest call must show at one leaf, and how the leaf enters the
/// executable.
pub enum FastLeaf {
    Array {
        aval: Py<PyAny>,
        sharding: Py<PyAny>,
        committed: bool,
        /// Whether the sharding is the executable's input sharding (else JAX moves it).
        direct: bool,
    },
    /// A numpy array, placed by the Rust shard path.
    Numpy {
        dtype: Py<PyArrayDescr>,
        shape: Vec<usize>,
    },
}

/// How a repeat of the call is flattened.
enum Shape {
    /// The positional arguments are the leaves themselves.
    Flat,
    /// Builtin containers, flattened in Rust; the structure of the call `(args, kwargs)`.
    Rust(Arc<Structure>),
    /// Custom pytree nodes: JAX's registry flattens `(args, {})`, whose tree must be this one.
    Jax(Py<PyAny>),
}

pub struct FastKey {
    shape: Shape,
    pub leaves: Vec<FastLeaf>,
    /// Whether every leaf is an array that the executable takes as it is.
    pub passthrough: bool,
    context: Py<PyTuple>,
}

impl FastKey {
    /// The fast key of a call of positional `args` keyed by `signature`, whose flat leaves are
    /// `leaves`; None if a repeat cannot be recognised by identity. `entry` runs the call.
    pub fn new(
        py: Python<'_>,
        args: &Bound<'_, PyTuple>,
        leaves: &[Bound<'_, PyAny>],
        signature: &Signature,
        entry: &Entry,
    ) -> PyResult<Option<Self>> {
        if !signature.positional_only {
            return Ok(None);
        }
        let Ok(context) = signature.context.obj.bind(py).cast::<PyTuple>() else {
            return Ok(None);
        };
        let call = match &signature.tree {
            // The call was flattened in Rust: its structure is the one to repeat.
            Tree::Rust(call) => Some(call.clone()),
            // JAX's registry flattened it (for its leaves or nodes); builtin containers around
            // leaves that JAX also found are still flattened in Rust on a repeat.
            Tree::Jax(_) => match Structure::of(args.as_any())? {
                Some(structure) => {
                    let mut ours = Vec::with_capacity(leaves.len());
                    let same = structure.flatten(args.as_any(), &mut ours)?
                        && ours.len() == leaves.len()
                        && ours.iter().zip(leaves).all(|(a, b)| a.is(b));
                    same.then(|| {
                        Arc::new(Structure::Tuple(vec![structure, Structure::Dict(vec![])]))
                    })
                }
                None => None,
            },
        };
        let shape = match (call, &signature.tree) {
            (Some(call), _) => match call.call_args() {
                Some(Structure::Tuple(children))
                    if children.iter().all(|c| matches!(c, Structure::Leaf)) =>
                {
                    Shape::Flat
                }
                Some(_) => Shape::Rust(call),
                None => return Ok(None),
            },
            (None, Tree::Jax(treedef)) => Shape::Jax(treedef.obj.clone_ref(py)),
            (None, Tree::Rust(_)) => return Ok(None),
        };
        let mut fast_leaves = Vec::with_capacity(leaves.len());
        for (j, (leaf, key)) in leaves.iter().zip(&signature.leaves).enumerate() {
            fast_leaves.push(match &key.kind {
                LeafKind::Array {
                    sharding,
                    committed,
                    aval,
                } => FastLeaf::Array {
                    aval: aval.clone_ref(py),
                    sharding: sharding.obj.clone_ref(py),
                    committed: *committed,
                    direct: match entry.in_sharding_of_arg(py, j) {
                        Some(s) => s.is(&sharding.obj) || s.bind(py).eq(sharding.obj.bind(py))?,
                        None => true,
                    },
                },
                LeafKind::Numpy => match leaf.cast_exact::<PyUntypedArray>() {
                    Ok(array) => FastLeaf::Numpy {
                        dtype: array.dtype().unbind(),
                        shape: array.shape().to_vec(),
                    },
                    // Numpy scalars and subclasses of ndarray are keyed each time.
                    Err(_) => return Ok(None),
                },
                LeafKind::Scalar => return Ok(None),
            });
        }
        let passthrough = entry.takes_args_as_given()
            && fast_leaves
                .iter()
                .all(|leaf| matches!(leaf, FastLeaf::Array { direct: true, .. }));
        Ok(Some(Self {
            shape,
            passthrough,
            leaves: fast_leaves,
            context: context.clone().unbind(),
        }))
    }

    /// The leaves of positional `args` if the call repeats this key's call, else None.
    pub fn matches<'py>(
        &self,
        py: Python<'py>,
        h: &Handles,
        args: &Bound<'py, PyTuple>,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let leaves = match &self.shape {
            Shape::Flat => {
                if args.len() != self.leaves.len() {
                    return Ok(None);
                }
                args.clone()
            }
            Shape::Rust(call) => {
                let mut leaves = Vec::with_capacity(self.leaves.len());
                let Some(structure) = call.call_args() else {
                    return Ok(None);
                };
                if !structure.flatten(args.as_any(), &mut leaves)? {
                    return Ok(None);
                }
                PyTuple::new(py, leaves)?
            }
            Shape::Jax(expected) => {
                let (leaves, treedef): (Bound<'py, PyList>, Bound<'py, PyAny>) = h
                    .flatten
                    .bind(py)
                    .call1(((args, PyDict::new(py)),))?
                    .extract()?;
                if !treedef.eq(expected.bind(py))? || leaves.len() != self.leaves.len() {
                    return Ok(None);
                }
                leaves.to_tuple()
            }
        };
        let array_type = h.array_impl.as_ptr().cast::<pyo3::ffi::PyTypeObject>();
        for (leaf, key) in leaves.iter_borrowed().zip(&self.leaves) {
            let same = match key {
                FastLeaf::Array {
                    aval,
                    sharding,
                    committed,
                    ..
                } => {
                    std::ptr::eq(leaf.get_type_ptr(), array_type)
                        && h.array_aval.bind(py).call1((&leaf,))?.is(aval)
                        && h.array_sharding.bind(py).call1((&leaf,))?.is(sharding)
                        && h.array_committed.bind(py).call1((&leaf,))?.is_truthy()? == *committed
                }
                FastLeaf::Numpy { dtype, shape } => match leaf.cast_exact::<PyUntypedArray>() {
                    Ok(array) => array.dtype().is(dtype) && array.shape() == shape.as_slice(),
                    Err(_) => false,
                },
            };
            if !same {
                return Ok(None);
            }
        }
        Ok(h.jit_key_is(py, self.context.bind(py))?.then_some(leaves))
    }
}
