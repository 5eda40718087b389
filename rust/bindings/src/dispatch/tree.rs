//! The tree of a call's dynamic arguments, flattened in JAX's order. Builtin containers (exact
//! tuples, lists, dicts, and None, which has no leaves) are read here; every other node (a
//! namedtuple, a registered class or dataclass) is taken apart one level by JAX's pytree
//! registry, which gives its children and its node data, and its children are read here in
//! turn. A call usually repeats the tree of the call before it, so a call is first flattened
//! against a known tree, which reads dicts by their known keys instead of sorting them again
//! (and a dict whose keys come in the known dict's order, as the same objects, in that order).
//! An executable's output tree of builtin containers is kept here too, and built from its
//! outputs.

use std::hash::{Hash, Hasher};
use std::sync::{Arc, LazyLock};

use pyo3::ffi;
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple, PyType};
use pyo3::PyTraverseError;
use rustc_hash::{FxHashMap, FxHasher};

use super::signature::Unkeyable;
use crate::errors::DispatchError;
use crate::handles::{names, Handles};
use crate::memo::SharedMemo;

/// How deeply containers may nest in a tree read here. Reading a tree recurses, as do
/// flattening a call against it and building outputs from it; a deeper tree is left to JAX,
/// which handles what depth it does (its own limit is far deeper on the main thread, but a
/// thread's stack can be small: JAX's flatten works up to about 600 levels in a thread of
/// 256 KiB, which this bound keeps well within).
pub const MAX_DEPTH: usize = 100;

pub enum Node {
    Leaf,
    Nothing,
    Tuple(usize),
    List(usize),
    /// A dict's keys in JAX's order (sorted), and where each key of the dict that the tree was
    /// read from, in that dict's own order, comes among them: a dict whose keys come in the
    /// same order (as the same objects) is flattened without looking a key up.
    Dict {
        keys: Vec<Py<PyAny>>,
        order: Vec<u32>,
    },
    /// An instance of a class registered with `jax.tree_util.register_dataclass`, taken apart
    /// here as JAX's registry does: its data fields are its children, and the values of its
    /// meta fields (compared by `==`) are its node data.
    Dataclass {
        kind: Py<PyType>,
        fields: Arc<DataclassFields>,
        meta: Vec<Py<PyAny>>,
    },
    /// A node that JAX's registry takes apart: its type, its node data (JAX's treedefs
    /// compare it by `==`), and how many children it has.
    Registered {
        kind: Py<PyType>,
        data: Py<PyAny>,
        data_hash: isize,
        arity: usize,
    },
}

/// The attribute names of a registered dataclass.
pub struct DataclassFields {
    data: Vec<Py<PyString>>,
    meta: Vec<Py<PyString>>,
}

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

/// The nodes of each dynamic argument in turn, in preorder.
pub struct Tree {
    nodes: Vec<Node>,
    pub hash: u64,
    pub num_leaves: usize,
    /// Whether every dynamic argument is a leaf: the leaves are the arguments.
    pub flat: bool,
}

impl Tree {
    /// The tree of a call without dynamic arguments, shared.
    pub fn empty() -> &'static Arc<Self> {
        static EMPTY: LazyLock<Arc<Tree>> = LazyLock::new(|| {
            Arc::new(Tree {
                nodes: Vec::new(),
                hash: 0,
                num_leaves: 0,
                flat: true,
            })
        });
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
        let mut hasher = FxHasher::default();
        for node in &nodes {
            match node {
                Node::Leaf => 0u8.hash(&mut hasher),
                Node::Nothing => 1u8.hash(&mut hasher),
                Node::Tuple(n) => (2u8, n).hash(&mut hasher),
                Node::List(n) => (3u8, n).hash(&mut hasher),
                Node::Dict { keys, .. } => {
                    (4u8, keys.len()).hash(&mut hasher);
                    for key in keys {
                        key.bind(py).hash()?.hash(&mut hasher);
                    }
                }
                Node::Registered {
                    kind,
                    data_hash,
                    arity,
                    ..
                } => (5u8, kind.as_ptr() as usize, data_hash, arity).hash(&mut hasher),
                Node::Dataclass { kind, meta, .. } => {
                    (6u8, kind.as_ptr() as usize, meta.len()).hash(&mut hasher);
                    for value in meta {
                        value.bind(py).hash()?.hash(&mut hasher);
                    }
                }
            }
        }
        Ok(Self {
            flat: nodes.iter().all(|n| matches!(n, Node::Leaf)),
            nodes,
            hash: hasher.finish(),
            num_leaves,
        })
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
        for node in &self.nodes {
            match node {
                Node::Leaf | Node::Nothing | Node::Tuple(_) | Node::List(_) => {}
                Node::Dict { keys, .. } => {
                    for key in keys {
                        visit.call(key)?;
                    }
                }
                Node::Dataclass { kind, meta, .. } => {
                    visit.call(kind)?;
                    for value in meta {
                        visit.call(value)?;
                    }
                }
                Node::Registered { kind, data, .. } => {
                    visit.call(kind)?;
                    visit.call(data)?;
                }
            }
        }
        Ok(())
    }

    /// Whether two trees are the same (dict keys and treedefs compared by `==`).
    pub fn same(&self, py: Python<'_>, other: &Self) -> PyResult<bool> {
        if self.hash != other.hash || self.nodes.len() != other.nodes.len() {
            return Ok(false);
        }
        for (a, b) in self.nodes.iter().zip(&other.nodes) {
            let same = match (a, b) {
                (Node::Leaf, Node::Leaf) | (Node::Nothing, Node::Nothing) => true,
                (Node::Tuple(m), Node::Tuple(n)) | (Node::List(m), Node::List(n)) => m == n,
                (Node::Dict { keys: a, .. }, Node::Dict { keys: b, .. }) => {
                    a.len() == b.len() && all_equal(py, a.iter().zip(b))?
                }
                (
                    Node::Registered {
                        kind: a,
                        data: a_data,
                        arity: m,
                        ..
                    },
                    Node::Registered {
                        kind: b,
                        data: b_data,
                        arity: n,
                        ..
                    },
                ) => a.is(b) && m == n && (a_data.is(b_data) || a_data.bind(py).eq(b_data)?),
                (
                    Node::Dataclass {
                        kind: a, meta: m, ..
                    },
                    Node::Dataclass {
                        kind: b, meta: n, ..
                    },
                ) => a.is(b) && m.len() == n.len() && all_equal(py, m.iter().zip(n))?,
                _ => false,
            };
            if !same {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

fn all_equal<'a>(
    py: Python<'_>,
    pairs: impl Iterator<Item = (&'a Py<PyAny>, &'a Py<PyAny>)>,
) -> PyResult<bool> {
    for (a, b) in pairs {
        if !(a.is(b) || a.bind(py).eq(b.bind(py))?) {
            return Ok(false);
        }
    }
    Ok(true)
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
        Node::Dataclass { .. } | Node::Registered { .. } => Err(DispatchError::OutputTree(
            "the output tree has a node that is not builtin".to_owned(),
        )
        .into()),
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
    DispatchError::OutputTree(format!("{count} outputs do not fill the output tree")).into()
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
    let kind = value.get_type_ptr();
    std::ptr::eq(kind, h.arrays.array_impl.as_ptr().cast())
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
