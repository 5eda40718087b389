//! The tree of a call's dynamic arguments, flattened in JAX's order. Builtin containers (exact
//! tuples, lists, dicts, and None, which has no leaves) are read here; every other node (a
//! namedtuple, a registered class or dataclass) is taken apart one level by JAX's pytree
//! registry, which gives its children and its node data, and its children are read here in
//! turn. A call usually repeats the tree of the call before it, so a call is first flattened
//! against a known tree, which reads dicts by their known keys instead of sorting them again
//! (and a dict whose keys come in the known dict's order, as the same objects, in that order).
//! An executable's output tree of builtin containers is kept here too, and built from its
//! outputs.

use std::sync::{Arc, LazyLock};

use fastpjit_core::dispatch::describe as core_describe;
use fastpjit_core::dispatch::tree as core_tree;
use fastpjit_core::dispatch::{Unkeyable, MAX_TREE_DEPTH as MAX_DEPTH};
use pyo3::ffi;
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple, PyType};
use pyo3::PyTraverseError;
use rustc_hash::FxHashMap;

use crate::errors::{refusal, DispatchError};
use crate::handles::{names, Handles};
use crate::memo::SharedMemo;

/// The handles of a tree read here: Python objects, types and attribute names.
pub struct PyHandles;

impl core_tree::Handles for PyHandles {
    type Object = Py<PyAny>;
    type Type = Py<PyType>;
    type Name = Py<PyString>;
}

/// Objects compared and hashed by Python, under the GIL.
struct Live<'py>(Python<'py>);

impl core_tree::Objects<PyHandles> for Live<'_> {
    type Error = PyErr;

    fn hash(&self, object: &Py<PyAny>) -> PyResult<isize> {
        object.bind(self.0).hash()
    }

    fn eq(&self, a: &Py<PyAny>, b: &Py<PyAny>) -> PyResult<bool> {
        Ok(a.is(b) || a.bind(self.0).eq(b.bind(self.0))?)
    }

    fn type_id(&self, kind: &Py<PyType>) -> usize {
        kind.as_ptr() as usize
    }
}

pub type Node = core_tree::Node<PyHandles>;
pub type DataclassFields = core_tree::DataclassFields<PyHandles>;

/// The fields of each type seen, by identity (held): `None` for a type that is no registered
/// dataclass. Types are few and long-lived; the map forgets everything when full.
static DATACLASSES: SharedMemo<usize, Arc<KnownType>> = SharedMemo::new(256);

/// A type, held, and its dataclass fields if it is a registered dataclass.
type KnownType = (Py<PyType>, Option<Arc<DataclassFields>>);

/// A tree read from a call's arguments, and their leaves.
type Derived<'py> = (Tree, Vec<Bound<'py, PyAny>>);

/// A node's children and node data, as JAX's registry gives them.
type OneLevel<'py> = (Vec<Bound<'py, PyAny>>, Bound<'py, PyAny>);

fn dataclass_fields(
    h: &Handles,
    kind: &Bound<'_, PyType>,
) -> PyResult<Option<Arc<DataclassFields>>> {
    let id = kind.as_ptr() as usize;
    if let Some(known) = DATACLASSES.get(&id) {
        return Ok(known.1.clone());
    }
    let found = h.dataclass_fields.bind(kind.py()).call1((kind,))?;
    let fields = if found.is_none() {
        None
    } else {
        let (data, meta): (Vec<Bound<'_, PyString>>, Vec<Bound<'_, PyString>>) = found.extract()?;
        let intern = |names: Vec<Bound<'_, PyString>>| -> PyResult<Vec<Py<PyString>>> {
            names
                .iter()
                .map(|n| Ok(PyString::intern(kind.py(), n.to_str()?).unbind()))
                .collect()
        };
        Some(Arc::new(DataclassFields {
            data: intern(data)?,
            meta: intern(meta)?,
        }))
    };
    DATACLASSES.insert(id, Arc::new((kind.clone().unbind(), fields.clone())));
    Ok(fields)
}

/// A call's tree (see the core's `Tree`), with how it is read from Python values and how an
/// output tree builds them.
pub struct Tree(core_tree::Tree<PyHandles>);

impl std::ops::Deref for Tree {
    type Target = core_tree::Tree<PyHandles>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl Tree {
    /// The tree of a call without dynamic arguments, shared.
    pub fn empty() -> &'static Arc<Self> {
        static EMPTY: LazyLock<Arc<Tree>> =
            LazyLock::new(|| Arc::new(Tree(core_tree::Tree::empty())));
        &EMPTY
    }

    /// The tree of `args` and their leaves, read from the values; why not when an argument
    /// holds an object that is neither a container nor a leaf (JAX's registry says which), or
    /// containers nested deeper than `MAX_DEPTH`.
    pub fn derive<'py>(
        py: Python<'py>,
        h: &Handles,
        args: &[Bound<'py, PyAny>],
    ) -> PyResult<Result<Derived<'py>, Unkeyable>> {
        let mut nodes = Vec::new();
        let mut leaves = Vec::with_capacity(args.len());
        for arg in args {
            if let Err(why) = derive_into(h, arg, &mut nodes, &mut leaves, 0)? {
                return Ok(Err(why));
            }
        }
        let tree = Self::of(py, nodes, leaves.len())?;
        Ok(Ok((tree, leaves)))
    }

    fn of(py: Python<'_>, nodes: Vec<Node>, num_leaves: usize) -> PyResult<Self> {
        core_tree::Tree::new(nodes, num_leaves, &Live(py)).map(Self)
    }

    /// Pushes the leaves of `args` onto `leaves` if `args` have this tree; false if they do
    /// not (`leaves` then holds a part of them).
    pub fn flatten<'py>(
        &self,
        h: &Handles,
        args: &[Bound<'py, PyAny>],
        leaves: &mut Vec<Bound<'py, PyAny>>,
    ) -> PyResult<bool> {
        let mut nodes = self.nodes.iter();
        for arg in args {
            if !flatten_into(h, &mut nodes, arg.clone(), leaves)? {
                return Ok(false);
            }
        }
        Ok(nodes.next().is_none() && leaves.len() == self.num_leaves)
    }

    /// The tree of the values that `treedef` (a JAX `PyTreeDef`) unflattens to, where its
    /// nodes are builtin containers only (tuples, lists, dicts and None); else None.
    pub fn of_builtin_treedef(treedef: &Bound<'_, PyAny>) -> PyResult<Option<Self>> {
        let mut nodes = Vec::new();
        let mut num_leaves = 0;
        if !builtin_nodes(treedef, &mut nodes, &mut num_leaves, 0)? {
            return Ok(None);
        }
        Self::of(treedef.py(), nodes, num_leaves).map(Some)
    }

    /// The value of this tree (one of builtin containers, see `of_builtin_treedef`) whose
    /// leaves are `leaves`, in order.
    pub fn unflatten<'py>(&self, leaves: &Bound<'py, PyList>) -> PyResult<Bound<'py, PyAny>> {
        let (py, count) = (leaves.py(), leaves.len());
        let (mut nodes, mut leaves) = (self.nodes.iter(), leaves.iter());
        let value = build(py, &mut nodes, &mut leaves, count)?;
        if nodes.next().is_some() || leaves.next().is_some() {
            return Err(unfilled(count));
        }
        Ok(value)
    }

    /// Visits the objects the tree holds: dict keys, node types, node data.
    pub fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.try_for_each_handle(|object| visit.call(object), |kind| visit.call(kind))
    }

    /// Whether two trees are the same (dict keys and node data compared by `==`).
    pub fn same(&self, py: Python<'_>, other: &Self) -> PyResult<bool> {
        self.0.same(other, &Live(py))
    }
}

impl Tree {
    /// How the tree reads, and the path of each leaf (see the core's `Tree::describe`).
    pub fn describe(&self, py: Python<'_>, roots: &[String]) -> PyResult<(String, Vec<String>)> {
        self.0.describe(roots, &Live(py))
    }
}

impl core_describe::Texts<PyHandles> for Live<'_> {
    type Error = PyErr;

    fn repr(&self, object: &Py<PyAny>) -> PyResult<String> {
        Ok(object.bind(self.0).repr()?.to_string())
    }

    fn type_name(&self, kind: &Py<PyType>) -> PyResult<String> {
        Ok(kind.bind(self.0).qualname()?.to_string())
    }

    fn name(&self, name: &Py<PyString>) -> PyResult<String> {
        Ok(name.bind(self.0).to_string())
    }

    /// A `NamedTuple`'s fields: JAX's node for one holds the type itself as its data.
    fn fields(
        &self,
        kind: &Py<PyType>,
        data: &Py<PyAny>,
        arity: usize,
    ) -> PyResult<Option<Vec<String>>> {
        let kind = kind.bind(self.0);
        if !data.is(kind) || !kind.is_subclass_of::<PyTuple>()? {
            return Ok(None);
        }
        let Ok(fields) = kind.getattr("_fields") else {
            return Ok(None);
        };
        let fields: Vec<String> = fields.extract().unwrap_or_default();
        Ok((fields.len() == arity).then_some(fields))
    }
}

/// Appends the nodes and leaves of `value`, a node `depth` containers deep; why not if it
/// holds an object that is no leaf, or containers deeper than `MAX_DEPTH`.
fn derive_into<'py>(
    h: &Handles,
    value: &Bound<'py, PyAny>,
    nodes: &mut Vec<Node>,
    leaves: &mut Vec<Bound<'py, PyAny>>,
    depth: usize,
) -> PyResult<Result<(), Unkeyable>> {
    let py = value.py();
    if value.is_none() {
        nodes.push(Node::Nothing);
        return Ok(Ok(()));
    }
    if depth >= MAX_DEPTH && !is_leaf_type(h, value) {
        return Ok(Err(Unkeyable::Deep));
    }
    if let Ok(tuple) = value.cast_exact::<PyTuple>() {
        nodes.push(Node::Tuple(tuple.len()));
        return derive_all(h, tuple.iter(), nodes, leaves, depth + 1);
    }
    if let Ok(list) = value.cast_exact::<PyList>() {
        nodes.push(Node::List(list.len()));
        return derive_all(h, list.iter(), nodes, leaves, depth + 1);
    }
    if let Ok(dict) = value.cast_exact::<PyDict>() {
        let sorted = h.sorted.bind(py);
        // Keys that do not sort (mixed types) are left to JAX's registry below.
        if let Ok(keys) = sorted.call1((dict,)) {
            let keys = keys.cast_into::<PyList>()?;
            let sorted_at: FxHashMap<usize, u32> = (0u32..)
                .zip(keys.iter())
                .map(|(at, key)| (key.as_ptr() as usize, at))
                .collect();
            // Every key is among them: `sorted` gives back the dict's own key objects.
            let Some(order) = dict
                .keys()
                .iter()
                .map(|key| sorted_at.get(&(key.as_ptr() as usize)).copied())
                .collect::<Option<Vec<u32>>>()
            else {
                return Ok(Err(Unkeyable::Leaf));
            };
            nodes.push(Node::Dict {
                keys: keys.iter().map(Bound::unbind).collect(),
                order,
            });
            for key in keys.iter() {
                let Some(item) = dict.get_item(&key)? else {
                    return Ok(Err(Unkeyable::Leaf));
                };
                if let Err(why) = derive_into(h, &item, nodes, leaves, depth + 1)? {
                    return Ok(Err(why));
                }
            }
            return Ok(Ok(()));
        }
    } else if is_leaf_type(h, value) {
        nodes.push(Node::Leaf);
        leaves.push(value.clone());
        return Ok(Ok(()));
    }
    let kind = value.get_type();
    if let Some(fields) = dataclass_fields(h, &kind)? {
        let mut meta = Vec::with_capacity(fields.meta.len());
        for name in &fields.meta {
            meta.push(value.getattr(name.bind(py))?.unbind());
        }
        nodes.push(Node::Dataclass {
            kind: kind.unbind(),
            fields: fields.clone(),
            meta,
        });
        for name in &fields.data {
            if let Err(why) =
                derive_into(h, &value.getattr(name.bind(py))?, nodes, leaves, depth + 1)?
            {
                return Ok(Err(why));
            }
        }
        return Ok(Ok(()));
    }
    let Some((children, data)) = one_level(h, value)? else {
        // JAX's registry holds it as a leaf, and it is none the dispatcher keys.
        return Ok(Err(Unkeyable::Leaf));
    };
    let Ok(data_hash) = data.hash() else {
        return Ok(Err(Unkeyable::Leaf));
    };
    nodes.push(Node::Registered {
        kind: value.get_type().unbind(),
        data: data.unbind(),
        data_hash,
        arity: children.len(),
    });
    derive_all(h, children.into_iter(), nodes, leaves, depth + 1)
}

/// Appends the nodes and leaves of `items`, each a node `depth` containers deep, as
/// `derive_into` does.
fn derive_all<'py>(
    h: &Handles,
    items: impl Iterator<Item = Bound<'py, PyAny>>,
    nodes: &mut Vec<Node>,
    leaves: &mut Vec<Bound<'py, PyAny>>,
    depth: usize,
) -> PyResult<Result<(), Unkeyable>> {
    for item in items {
        if let Err(why) = derive_into(h, &item, nodes, leaves, depth)? {
            return Ok(Err(why));
        }
    }
    Ok(Ok(()))
}

/// The values of `dict`, which has as many keys as `keys`, in JAX's order, if its keys are
/// those of the tree's dict in that dict's order (`order`), as the same objects; None if not.
/// (Every place is filled then: `order` is a permutation.)
fn items_in_known_order<'py>(
    dict: &Bound<'py, PyDict>,
    keys: &[Py<PyAny>],
    order: &[u32],
) -> Option<Vec<Option<Bound<'py, PyAny>>>> {
    let py = dict.py();
    let mut items = vec![None; keys.len()];
    let (mut next, mut key, mut value) = (0, std::ptr::null_mut(), std::ptr::null_mut());
    for &at in order {
        // SAFETY: `dict` is a live dict, held by the caller; `key` and `value` are borrowed
        // from it, and nothing that could change it runs before `value` is taken.
        if unsafe {
            pyo3::ffi::PyDict_Next(dict.as_ptr(), &raw mut next, &raw mut key, &raw mut value)
        } == 0
            || key != keys[at as usize].as_ptr()
        {
            return None;
        }
        // SAFETY: `value` is a live object, borrowed from `dict`.
        items[at as usize] = Some(unsafe { Bound::from_borrowed_ptr(py, value) });
    }
    Some(items)
}

/// Pushes the nodes of `treedef`, a node `depth` containers deep, in preorder, as JAX's
/// `node_data` and `children` give them; false at a node that is not a builtin container, and
/// below `MAX_DEPTH` containers (JAX's `unflatten` builds such trees).
fn builtin_nodes(
    treedef: &Bound<'_, PyAny>,
    nodes: &mut Vec<Node>,
    num_leaves: &mut usize,
    depth: usize,
) -> PyResult<bool> {
    let py = treedef.py();
    if depth >= MAX_DEPTH {
        return Ok(false);
    }
    let data = treedef.call_method0(names(py).node_data.bind(py))?;
    if data.is_none() {
        nodes.push(Node::Leaf);
        *num_leaves += 1;
        return Ok(true);
    }
    let (kind, keys): (Bound<'_, PyType>, Bound<'_, PyAny>) = data.extract()?;
    let children = treedef.call_method0(names(py).children.bind(py))?;
    let children = children.cast::<PyList>()?;
    let n = children.len();
    nodes.push(if kind.is(py.get_type::<PyTuple>()) {
        Node::Tuple(n)
    } else if kind.is(py.get_type::<PyList>()) {
        Node::List(n)
    } else if kind.is(py.None().bind(py).get_type()) {
        Node::Nothing
    } else if kind.is(py.get_type::<PyDict>()) {
        // JAX's order of the keys; a dict is built in that order.
        let keys: Vec<Py<PyAny>> = keys.extract()?;
        if keys.len() != n {
            return Ok(false);
        }
        Node::Dict {
            order: (0..n as u32).collect(),
            keys,
        }
    } else {
        return Ok(false);
    });
    for child in children.iter() {
        if !builtin_nodes(&child, nodes, num_leaves, depth + 1)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The value of the builtin node that `nodes` comes to next, with its leaves from `leaves`.
fn build<'py>(
    py: Python<'py>,
    nodes: &mut std::slice::Iter<'_, Node>,
    leaves: &mut impl Iterator<Item = Bound<'py, PyAny>>,
    count: usize,
) -> PyResult<Bound<'py, PyAny>> {
    let Some(node) = nodes.next() else {
        return Err(unfilled(count));
    };
    match node {
        Node::Leaf => leaves.next().ok_or_else(|| unfilled(count)),
        Node::Nothing => Ok(py.None().into_bound(py)),
        Node::Tuple(n) => {
            let tuple: SequenceApi = (ffi::PyTuple_New, ffi::PyTuple_SET_ITEM);
            sequence(py, *n, tuple, nodes, leaves, count)
        }
        Node::List(n) => {
            let list: SequenceApi = (ffi::PyList_New, ffi::PyList_SET_ITEM);
            sequence(py, *n, list, nodes, leaves, count)
        }
        Node::Dict { keys, .. } => {
            let dict = PyDict::new(py);
            for key in keys {
                dict.set_item(key, child(py, nodes, leaves, count)?)?;
            }
            Ok(dict.into_any())
        }
        Node::Dataclass { .. } | Node::Registered { .. } => Err(refusal(
            DispatchError::OutputTree("the output tree has a node that is not builtin".to_owned()),
        )),
    }
}

/// The constructor of a tuple or list of empty slots (`PyTuple_New`), and its setter of one slot.
type SequenceApi = (
    unsafe extern "C" fn(ffi::Py_ssize_t) -> *mut ffi::PyObject,
    unsafe fn(*mut ffi::PyObject, ffi::Py_ssize_t, *mut ffi::PyObject),
);

/// A tuple or list (by `api`) of `n` children, made at its size and filled as its children are
/// built.
fn sequence<'py>(
    py: Python<'py>,
    n: usize,
    (new, set): SequenceApi,
    nodes: &mut std::slice::Iter<'_, Node>,
    leaves: &mut impl Iterator<Item = Bound<'py, PyAny>>,
    count: usize,
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: `new` (`PyTuple_New`, `PyList_New`) gives a new container of `n` empty slots, or
    // NULL with the error set, which `from_owned_ptr_or_err` raises. Each slot is set once,
    // below `n`, with an owned reference. Until then it is NULL, which CPython's tuple and
    // list code allows (deallocation, the garbage collector's traversal).
    let sequence = unsafe { Bound::from_owned_ptr_or_err(py, new(ssize(n)))? };
    for i in 0..n {
        let child = child(py, nodes, leaves, count)?;
        // SAFETY: slot `i` is below `n` and still empty; the setter steals the owned
        // reference that `into_ptr` gives.
        unsafe { set(sequence.as_ptr(), ssize(i), child.into_ptr()) };
    }
    Ok(sequence)
}

/// A container's next child, as `build` builds it; a leaf is taken without a call.
#[inline]
fn child<'py>(
    py: Python<'py>,
    nodes: &mut std::slice::Iter<'_, Node>,
    leaves: &mut impl Iterator<Item = Bound<'py, PyAny>>,
    count: usize,
) -> PyResult<Bound<'py, PyAny>> {
    if let Some(Node::Leaf) = nodes.as_slice().first() {
        nodes.next();
        return leaves.next().ok_or_else(|| unfilled(count));
    }
    build(py, nodes, leaves, count)
}

/// A container's size as a `Py_ssize_t` (a tree's sizes come from containers that exist).
fn ssize(n: usize) -> ffi::Py_ssize_t {
    ffi::Py_ssize_t::try_from(n).unwrap_or(ffi::Py_ssize_t::MAX)
}

/// The executable's outputs are not the leaves of its output tree (which jaxlib rules out).
fn unfilled(count: usize) -> PyErr {
    refusal(DispatchError::OutputTree(format!(
        "{count} outputs do not fill the output tree"
    )))
}

/// `value` taken apart one level by JAX's registry: its children and node data; None for a
/// leaf.
fn one_level<'py>(h: &Handles, value: &Bound<'py, PyAny>) -> PyResult<Option<OneLevel<'py>>> {
    let py = value.py();
    let found = h.flatten_one_level.bind(py).call1((value,))?;
    if found.is_none() {
        return Ok(None);
    }
    let (children, data): (Bound<'py, PyAny>, Bound<'py, PyAny>) = found.extract()?;
    let children = children
        .try_iter()?
        .collect::<PyResult<Vec<Bound<'py, PyAny>>>>()?;
    Ok(Some((children, data)))
}

/// Whether JAX's registry can only hold `value` as a leaf: a `jaxlib` array, a numpy array
/// or scalar, a Python scalar of an exact builtin type.
fn is_leaf_type(h: &Handles, value: &Bound<'_, PyAny>) -> bool {
    let py = value.py();
    h.is_array(value)
        || super::leaf::scalar_kind(value).is_some()
        || value
            .is_instance(h.arrays.ndarray.bind(py))
            .unwrap_or(false)
        || value
            .is_instance(h.arrays.numpy_scalar.bind(py))
            .unwrap_or(false)
}

fn flatten_into<'a, 'py>(
    h: &Handles,
    nodes: &mut impl Iterator<Item = &'a Node>,
    value: Bound<'py, PyAny>,
    leaves: &mut Vec<Bound<'py, PyAny>>,
) -> PyResult<bool> {
    let Some(node) = nodes.next() else {
        return Ok(false);
    };
    let py = value.py();
    match node {
        Node::Leaf => {
            leaves.push(value);
            Ok(true)
        }
        Node::Nothing => Ok(value.is_none()),
        Node::Tuple(n) => match value.cast_exact::<PyTuple>() {
            Ok(tuple) if tuple.len() == *n => {
                for item in tuple.iter() {
                    if !flatten_into(h, nodes, item, leaves)? {
                        return Ok(false);
                    }
                }
                Ok(true)
            }
            _ => Ok(false),
        },
        Node::List(n) => match value.cast_exact::<PyList>() {
            Ok(list) if list.len() == *n => {
                for item in list.iter() {
                    if !flatten_into(h, nodes, item, leaves)? {
                        return Ok(false);
                    }
                }
                Ok(true)
            }
            _ => Ok(false),
        },
        Node::Dict { keys, order } => {
            let Ok(dict) = value.cast_exact::<PyDict>() else {
                return Ok(false);
            };
            if dict.len() != keys.len() {
                return Ok(false);
            }
            if let Some(items) = items_in_known_order(dict, keys, order) {
                for item in items.into_iter().flatten() {
                    if !flatten_into(h, nodes, item, leaves)? {
                        return Ok(false);
                    }
                }
                return Ok(true);
            }
            // As many keys, each of them present: the same key set, in JAX's order.
            for key in keys {
                let Some(item) = dict.get_item(key.bind(py))? else {
                    return Ok(false);
                };
                if !flatten_into(h, nodes, item, leaves)? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        Node::Dataclass { kind, fields, meta } => {
            if !value.get_type().is(kind) {
                return Ok(false);
            }
            for (name, expected) in fields.meta.iter().zip(meta) {
                let found = value.getattr(name.bind(py))?;
                if !(found.is(expected) || found.eq(expected.bind(py))?) {
                    return Ok(false);
                }
            }
            for name in &fields.data {
                if !flatten_into(h, nodes, value.getattr(name.bind(py))?, leaves)? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        Node::Registered {
            kind, data, arity, ..
        } => {
            if !value.get_type().is(kind) {
                return Ok(false);
            }
            let Some((children, found)) = one_level(h, &value)? else {
                return Ok(false);
            };
            if children.len() != *arity || !(found.is(data) || found.eq(data.bind(py))?) {
                return Ok(false);
            }
            for child in children {
                if !flatten_into(h, nodes, child, leaves)? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::CStr;

    use pyo3::exceptions::PyRuntimeError;
    use pyo3::types::PyModule;

    use super::super::leaf::SeenArrays;
    use super::*;
    use crate::handles::handles;

    /// Trees to read, and JAX's flattening of them, the oracle. Defined once per process: a
    /// class is registered with JAX's registry once.
    const CASES: &CStr = cr#"
import collections
import dataclasses
import typing

import jax
import jax.numpy as jnp
import numpy as np

tree_util = jax.tree_util

Point = collections.namedtuple("Point", ["x", "y"])


class Empty(typing.NamedTuple):
    pass


@dataclasses.dataclass
class Params:
    w: object
    b: object
    name: str = "p"


tree_util.register_dataclass(Params, data_fields=["w", "b"], meta_fields=["name"])


class Box:
    def __init__(self, items, tag):
        self.items, self.tag = items, tag


tree_util.register_pytree_node(
    Box, lambda box: (tuple(box.items), box.tag), lambda tag, items: Box(list(items), tag)
)


class Tag:
    """Node data or a dict key compared by value, all of one hash."""

    def __init__(self, name):
        self.name = name

    def __eq__(self, other):
        return isinstance(other, Tag) and self.name == other.name

    def __lt__(self, other):
        return self.name < other.name

    def __hash__(self):
        return 0

    def __repr__(self):
        return f"Tag({self.name!r})"


def nested(depth, leaf):
    for _ in range(depth):
        leaf = [leaf]
    return leaf


def builtin():
    """Trees of builtin containers (and bare leaves), every leaf one the dispatcher keys."""
    return [
        {"b": 1, "a": (2.0, None), "c": [np.float32(3), {"z": np.ones(2), "y": 5}]},
        {3: 1.0, 1: 2.0, 2: [3, True]},
        [(), None, {}, [[]]],
        (),
        None,
        1.5,
        jnp.arange(3),
        (1 + 2j, np.int8(4)),
        nested(20, 7),
    ]


def other():
    """Trees with nodes that JAX's registry takes apart."""
    return [
        Point(1, {"q": 2, "p": [3, 4]}),
        Params(w=np.zeros(3), b=(1.0, 2.0)),
        Box([1, (2, 3)], "tag"),
        Empty(),
        (Point(Params(1, [2]), Box([], "t")), [Empty(), None, {"k": Box([4.0], 0)}]),
    ]


def twin(tree):
    """The same structure with other leaf objects, its dicts built in sorted key order."""
    return tree_util.tree_map(lambda leaf: leaf * 2, tree)


def differing():
    """Pairs of trees whose structures differ, one way each."""
    base = {"b": 1, "a": (2.0, None)}
    return [
        (base, {"b": 1, "d": (2.0, None)}),
        (base, {"b": 1, "a": (2.0, None), "c": 3}),
        (base, {"b": 1, "a": [2.0, None]}),
        ((1, 2), (1, 2, 3)),
        ([1, 2], [1]),
        ([1, 2], (1, 2)),
        ((1, None), (1, 2)),
        ([[1]], [1]),
        (Point(1, 2), (1, 2)),
        (Params(1, 2), Params(1, 2, name="q")),
        (Box([1], "tag"), Box([1], "other")),
        (Box([1], "tag"), Box([1, 2], "tag")),
        (Empty(), ()),
        (Box([1], Tag("a")), Box([1], Tag("b"))),
        (Params(1, 2, name=Tag("x")), Params(1, 2, name=Tag("y"))),
        ({Tag("k"): 1}, {Tag("j"): 1}),
    ]


def alike():
    """Pairs of trees of one structure, whose node data and dict keys are other objects."""
    return [
        (Box([1], Tag("a")), Box([2.0], Tag("a"))),
        (Params(1, 2, name=Tag("x")), Params(3, 4, name=Tag("x"))),
        ({Tag("k"): 1, Tag("j"): [2]}, {Tag("j"): [3], Tag("k"): 4}),
    ]
"#;

    fn cases(py: Python<'_>) -> Bound<'_, PyModule> {
        crate::testing::helper_module(py, c"fastpjit_tree_cases", CASES)
    }

    /// The values that `name()` of the cases gives.
    fn values<'py>(cases: &Bound<'py, PyModule>, name: &str) -> Vec<Bound<'py, PyAny>> {
        cases
            .getattr(name)
            .unwrap()
            .call0()
            .unwrap()
            .extract()
            .unwrap()
    }

    /// The builtin cases, then the others.
    fn every_case<'py>(cases: &Bound<'py, PyModule>) -> Vec<Bound<'py, PyAny>> {
        let mut all = values(cases, "builtin");
        all.extend(values(cases, "other"));
        all
    }

    fn derived<'py>(py: Python<'py>, args: &[Bound<'py, PyAny>]) -> Derived<'py> {
        let h = handles(py).unwrap();
        let Ok(derived) = Tree::derive(py, h, args).unwrap() else {
            panic!("{args:?} is keyable");
        };
        derived
    }

    /// JAX's leaves of `value` (the oracle).
    fn jax_leaves<'py>(value: &Bound<'py, PyAny>) -> Vec<Bound<'py, PyAny>> {
        value
            .py()
            .import("jax.tree_util")
            .unwrap()
            .call_method1("tree_leaves", (value,))
            .unwrap()
            .extract()
            .unwrap()
    }

    /// JAX's treedef of `value`.
    fn jax_structure<'py>(value: &Bound<'py, PyAny>) -> Bound<'py, PyAny> {
        value
            .py()
            .import("jax.tree_util")
            .unwrap()
            .call_method1("tree_structure", (value,))
            .unwrap()
    }

    /// The leaves are JAX's, the same objects in the same order.
    fn assert_same_leaves(what: &Bound<'_, PyAny>, ours: &[Bound<'_, PyAny>]) {
        let theirs = jax_leaves(what);
        assert_eq!(
            ours.len(),
            theirs.len(),
            "{what}: {ours:?} vs JAX's {theirs:?}"
        );
        for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
            assert!(a.is(b), "{what}: leaf {i} is {a}, JAX's is {b}");
        }
    }

    #[test]
    fn derive_gives_jaxs_leaves_in_jaxs_order() {
        Python::initialize();
        Python::attach(|py| {
            let cases = cases(py);
            let all = every_case(&cases);
            for value in &all {
                let (tree, leaves) = derived(py, std::slice::from_ref(value));
                assert_same_leaves(value, &leaves);
                assert_eq!(tree.num_leaves, leaves.len());
                // One argument is flat where JAX's treedef is a bare leaf (one node, one leaf:
                // None and () are one node of no leaves).
                let treedef = jax_structure(value);
                let count =
                    |name: &str| -> usize { treedef.getattr(name).unwrap().extract().unwrap() };
                let is_leaf = count("num_nodes") == 1 && count("num_leaves") == 1;
                assert_eq!(tree.flat, is_leaf, "{value}");
            }
            // Several arguments flatten as the tuple of them.
            let (tree, leaves) = derived(py, &all);
            assert_same_leaves(PyTuple::new(py, &all).unwrap().as_any(), &leaves);
            assert!(!tree.flat);
            let bare = [
                1.5f64.into_pyobject(py).unwrap().into_any(),
                2i64.into_pyobject(py).unwrap().into_any(),
            ];
            assert!(derived(py, &bare).0.flat);
        });
    }

    #[test]
    fn a_tree_flattens_values_of_its_structure_as_jax_does() {
        Python::initialize();
        Python::attach(|py| {
            let h = handles(py).unwrap();
            let cases = cases(py);
            let twin = cases.getattr("twin").unwrap();
            let all = every_case(&cases);
            for value in &all {
                let (tree, _) = derived(py, std::slice::from_ref(value));
                // The value itself (its dicts' keys in the order read), and a twin with other
                // leaves (its dicts built in sorted order, read by looking keys up).
                let other = twin.call1((value,)).unwrap();
                for value in [value, &other] {
                    let mut leaves = Vec::new();
                    assert!(tree
                        .flatten(h, std::slice::from_ref(value), &mut leaves)
                        .unwrap());
                    assert_same_leaves(value, &leaves);
                }
            }
            let mut leaves = Vec::new();
            assert!(tree_of(py, &all).flatten(h, &all, &mut leaves).unwrap());
            assert_same_leaves(PyTuple::new(py, &all).unwrap().as_any(), &leaves);
            // Fewer or more arguments than the tree's do not flatten.
            assert!(!tree_of(py, &all)
                .flatten(h, &all[1..], &mut Vec::new())
                .unwrap());
            assert!(!tree_of(py, &all[1..])
                .flatten(h, &all, &mut Vec::new())
                .unwrap());
        });
    }

    fn tree_of(py: Python<'_>, args: &[Bound<'_, PyAny>]) -> Tree {
        derived(py, args).0
    }

    #[test]
    fn trees_are_the_same_where_jaxs_treedefs_are_equal() {
        Python::initialize();
        Python::attach(|py| {
            let h = handles(py).unwrap();
            let cases = cases(py);
            let twin = cases.getattr("twin").unwrap();
            let all = every_case(&cases);
            // Every pair of cases, and each case with its twin.
            let mut pairs = Vec::new();
            for a in &all {
                pairs.push((a.clone(), twin.call1((a,)).unwrap()));
                for b in &all {
                    pairs.push((a.clone(), b.clone()));
                }
            }
            let differing: Vec<(Bound<'_, PyAny>, Bound<'_, PyAny>)> = cases
                .getattr("differing")
                .unwrap()
                .call0()
                .unwrap()
                .extract()
                .unwrap();
            for (a, b) in &differing {
                assert!(
                    !jax_structure(a).eq(jax_structure(b)).unwrap(),
                    "{a} vs {b}"
                );
            }
            pairs.extend(differing);
            let alike: Vec<(Bound<'_, PyAny>, Bound<'_, PyAny>)> =
                cases.call_method0("alike").unwrap().extract().unwrap();
            for (a, b) in &alike {
                assert!(jax_structure(a).eq(jax_structure(b)).unwrap(), "{a} vs {b}");
            }
            pairs.extend(alike);
            for (a, b) in &pairs {
                let equal = jax_structure(a).eq(jax_structure(b)).unwrap();
                let (ta, tb) = (
                    tree_of(py, std::slice::from_ref(a)),
                    tree_of(py, std::slice::from_ref(b)),
                );
                assert_eq!(ta.same(py, &tb).unwrap(), equal, "{a} vs {b}");
                assert_eq!(tb.same(py, &ta).unwrap(), equal, "{b} vs {a}");
                if equal {
                    assert_eq!(ta.hash, tb.hash, "{a} vs {b}");
                }
                // A value flattens against the other's tree where they are the same. A leaf of
                // a tree takes any value, so a value with a container (or None) where the tree
                // has a leaf flattens too: the dispatcher reads the leaves next, and refuses
                // such a leaf (then derives the tree anew).
                let mut leaves = Vec::new();
                let flattened = ta.flatten(h, std::slice::from_ref(b), &mut leaves).unwrap();
                if equal {
                    assert!(flattened, "{b} against the tree of {a}");
                } else if flattened {
                    let keys = SeenArrays::default().read_all(h, &leaves).unwrap();
                    assert!(keys.is_none(), "{b} against the tree of {a}: {leaves:?}");
                }
            }
        });
    }

    #[test]
    fn values_not_read_here_are_unkeyable() {
        Python::initialize();
        Python::attach(|py| {
            let h = handles(py).unwrap();
            let unkeyable = |value: Bound<'_, PyAny>| {
                let args = [value];
                Tree::derive(py, h, &args).unwrap().err()
            };
            let object = py.import("builtins").unwrap().getattr("object").unwrap();
            // A leaf that is no array or scalar, alone or in a container.
            let leaf = object.call0().unwrap();
            assert!(matches!(unkeyable(leaf.clone()), Some(Unkeyable::Leaf)));
            let dict = PyDict::new(py);
            dict.set_item("a", 1).unwrap();
            dict.set_item("b", (2, "text")).unwrap();
            assert!(matches!(unkeyable(dict.into_any()), Some(Unkeyable::Leaf)));
            // Containers as deep as MAX_DEPTH are read; deeper ones are not.
            let nested = cases(py).getattr("nested").unwrap();
            let deepest = nested.call1((MAX_DEPTH, 1)).unwrap();
            let (_, leaves) = derived(py, std::slice::from_ref(&deepest));
            assert_same_leaves(&deepest, &leaves);
            let deeper = nested.call1((MAX_DEPTH + 1, 1)).unwrap();
            assert!(matches!(unkeyable(deeper), Some(Unkeyable::Deep)));
        });
    }

    #[test]
    fn a_builtin_treedef_rebuilds_what_jax_unflattens() {
        Python::initialize();
        Python::attach(|py| {
            let cases = cases(py);
            for value in values(&cases, "builtin") {
                let treedef = jax_structure(&value);
                let Some(tree) = Tree::of_builtin_treedef(&treedef).unwrap() else {
                    panic!("{treedef} is builtin");
                };
                assert!(tree
                    .same(py, &tree_of(py, std::slice::from_ref(&value)))
                    .unwrap());
                let count: usize = treedef.getattr("num_leaves").unwrap().extract().unwrap();
                assert_eq!(tree.num_leaves, count);
                // New leaf objects, one per leaf.
                let leaves = PyList::new(py, (0..count).map(|i| format!("leaf {i}"))).unwrap();
                let ours = tree.unflatten(&leaves).unwrap();
                let theirs = treedef.call_method1("unflatten", (&leaves,)).unwrap();
                // The same containers, dict keys in the same order, the same leaf objects.
                assert_eq!(
                    ours.repr().unwrap().to_string(),
                    theirs.repr().unwrap().to_string()
                );
                assert!(jax_structure(&ours).eq(&treedef).unwrap());
                assert_same_leaves(&ours, &leaves.iter().collect::<Vec<_>>());
                // Too few or too many leaves are refused.
                if count > 0 {
                    let fewer = PyList::new(py, leaves.iter().skip(1)).unwrap();
                    let err = tree.unflatten(&fewer).unwrap_err();
                    assert!(err.is_instance_of::<PyRuntimeError>(py), "{err}");
                }
                leaves.append(0).unwrap();
                let err = tree.unflatten(&leaves).unwrap_err();
                assert!(err.is_instance_of::<PyRuntimeError>(py), "{err}");
            }
            // Trees with another node, and trees too deep to build here, are left to JAX.
            let nested = cases.getattr("nested").unwrap();
            let mut others = values(&cases, "other");
            others.push(nested.call1((2 * MAX_DEPTH, 1)).unwrap());
            others.push(
                PyList::new(py, [values(&cases, "other").remove(0)])
                    .unwrap()
                    .into_any(),
            );
            for value in others {
                let treedef = jax_structure(&value);
                assert!(
                    Tree::of_builtin_treedef(&treedef).unwrap().is_none(),
                    "{treedef}"
                );
            }
        });
    }
}
