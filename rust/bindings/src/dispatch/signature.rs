//! The call signature: what tells apart two calls that may need different executables, as
//! JAX's jit keys them (`jaxlib/pjit.cc`'s `CallSignature`). Static arguments by type, hash
//! and `==`, positional and keyword ones apart; keyword arguments by name; the tree of the
//! dynamic arguments; each leaf's signature (see `leaf`); and JAX's jit key (see `context`).
//!
//! A call is read into a `LiveCall`, which borrows the call's objects; a cache entry keeps a
//! `CallSignature`, which holds every object it compares. A hit compares the two without
//! building a signature: by identity first, by value only where identity differs.

use std::borrow::Cow;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use numpy::{PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};
use pyo3::PyTraverseError;
use rustc_hash::FxHasher;

use super::context::{Context, LiveContext};
use super::leaf::{
    array_hashes, aval_value, host_shape, sharding_id, AvalValue, DtypeKey, HostKind, LiveLeaf,
    ScalarKind, ShardingId,
};
use super::tree::Tree;
use crate::handles::Handles;

/// Which arguments are static, as the jitted function declares them.
pub struct StaticArgs {
    /// Positions; a negative one counts from the end of the call's positional arguments.
    pub argnums: Vec<isize>,
    pub argnames: Vec<Py<PyString>>,
}

/// A call's arguments split as its signature needs them. A call of positional dynamic
/// arguments only, each a leaf (the commonest), borrows the argument tuple for both. Its tree
/// is borrowed from the entry that the call was flattened against, where it was.
pub struct LiveCall<'a, 'py> {
    pub args: Bound<'py, PyTuple>,
    pub num_args: usize,
    /// The dynamic arguments in JAX's order (positional ones, then keyword ones by name),
    /// where some arguments are static or passed by keyword; else `args` are the dynamic ones.
    split: Option<Vec<Bound<'py, PyAny>>>,
    pub kwnames: Vec<Bound<'py, PyString>>,
    pub statics: Vec<Bound<'py, PyAny>>,
    pub static_names: Vec<Bound<'py, PyString>>,
    pub tree: Cow<'a, Arc<Tree>>,
    /// The leaves, where they are not the dynamic arguments themselves.
    nested: Option<Vec<Bound<'py, PyAny>>>,
    pub keys: Vec<LiveLeaf<'py>>,
    pub context: LiveContext<'py>,
}

impl<'a, 'py> LiveCall<'a, 'py> {
    /// Splits `(args, kwargs)` into static and dynamic arguments, keyword arguments sorted by
    /// name as JAX sorts them. The tree and leaves are filled in by the caller.
    pub fn split(
        statics: &StaticArgs,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
        context: LiveContext<'py>,
    ) -> PyResult<Self> {
        let py = args.py();
        let num_args = args.len();
        let kwargs = kwargs.filter(|k| !k.is_empty());
        let mut call = Self {
            args: args.clone(),
            num_args,
            split: None,
            kwnames: Vec::new(),
            statics: Vec::new(),
            static_names: Vec::new(),
            tree: Cow::Borrowed(Tree::empty()),
            nested: None,
            keys: Vec::new(),
            context,
        };
        if statics.argnums.is_empty() && kwargs.is_none() {
            return Ok(call);
        }
        let mut dynamic = Vec::with_capacity(num_args + kwargs.map_or(0, PyDictMethods::len));
        for (i, arg) in args.iter().enumerate() {
            let from_end = i as isize - num_args as isize;
            if statics
                .argnums
                .iter()
                .any(|&n| n == i as isize || n == from_end)
            {
                call.statics.push(arg);
            } else {
                dynamic.push(arg);
            }
        }
        if let Some(kwargs) = kwargs {
            let mut named: Vec<(Bound<'py, PyString>, Bound<'py, PyAny>)> = kwargs
                .iter()
                .map(|(name, value)| Ok((name.cast_into::<PyString>()?, value)))
                .collect::<PyResult<_>>()?;
            // JAX orders keyword arguments by name.
            named.sort_by(|(a, _), (b, _)| {
                a.to_str()
                    .unwrap_or_default()
                    .cmp(b.to_str().unwrap_or_default())
            });
            for (name, value) in named {
                let is_static = statics
                    .argnames
                    .iter()
                    .any(|s| s.is(&name) || s.bind(py).as_any().eq(&name).unwrap_or(false));
                if is_static {
                    call.static_names.push(name);
                    call.statics.push(value);
                } else {
                    call.kwnames.push(name);
                    dynamic.push(value);
                }
            }
        }
        call.split = Some(dynamic);
        Ok(call)
    }

    /// The dynamic arguments, in JAX's order.
    pub fn dynamic(&self) -> &[Bound<'py, PyAny>] {
        self.split
            .as_deref()
            .unwrap_or_else(|| self.args.as_slice())
    }

    /// The flat leaves of the dynamic arguments.
    pub fn leaves(&self) -> &[Bound<'py, PyAny>] {
        self.nested.as_deref().unwrap_or_else(|| self.dynamic())
    }

    /// Sets the tree, the leaves where they are not the dynamic arguments themselves, and
    /// what each leaf is.
    pub fn set_tree(
        &mut self,
        tree: Cow<'a, Arc<Tree>>,
        nested: Option<Vec<Bound<'py, PyAny>>>,
        keys: Vec<LiveLeaf<'py>>,
    ) {
        self.tree = tree;
        self.nested = nested;
        self.keys = keys;
    }

    /// The leaves as a tuple, the argument tuple itself where it is that.
    pub fn leaf_tuple(&self) -> PyResult<Bound<'py, PyTuple>> {
        if self.split.is_none() && self.nested.is_none() {
            return Ok(self.args.clone());
        }
        PyTuple::new(self.args.py(), self.leaves())
    }

    /// The hash that the signature of this call has, or why the call has no signature.
    pub fn hash(&self) -> PyResult<Result<u64, Unkeyable>> {
        let mut hasher = FxHasher::default();
        (self.num_args, self.kwnames.len(), self.static_names.len()).hash(&mut hasher);
        for name in self.kwnames.iter().chain(&self.static_names) {
            name.hash()?.hash(&mut hasher);
        }
        for value in &self.statics {
            match value.hash() {
                Ok(hash) => hash.hash(&mut hasher),
                Err(err) if err.is_instance_of::<PyTypeError>(value.py()) => {
                    return Ok(Err(Unkeyable::UnhashableStatic));
                }
                Err(err) => return Err(err),
            }
        }
        self.tree.hash.hash(&mut hasher);
        let Some(arrays) = array_hashes(&self.keys)? else {
            return Ok(Err(Unkeyable::Leaf));
        };
        for ((leaf, key), (aval_hash, sharding)) in self.leaves().iter().zip(&self.keys).zip(arrays)
        {
            match key {
                LiveLeaf::Array { committed, .. } => {
                    (0u8, aval_hash, sharding, committed).hash(&mut hasher);
                }
                LiveLeaf::Host { dtype, kind, .. } => {
                    (1u8, dtype, kind, host_shape(leaf)).hash(&mut hasher);
                }
                LiveLeaf::Scalar(kind) => (2u8, kind).hash(&mut hasher),
            }
        }
        Ok(Ok(hasher.finish()))
    }
}

/// Why a call has no signature; JAX's own path runs it (or raises its error).
#[derive(Clone, Copy)]
pub enum Unkeyable {
    /// A leaf that is not a value the dispatcher keys.
    Leaf,
    /// A static argument without a hash.
    UnhashableStatic,
    /// Containers nested deeper than the dispatcher reads (`tree::MAX_DEPTH`).
    Deep,
}

/// Whether two static arguments are equal as JAX compares them: the same type, then `==`;
/// JAX's error where `==` raises.
fn same_static(a: &Bound<'_, PyAny>, b: &Bound<'_, PyAny>) -> PyResult<bool> {
    if a.is(b) {
        return Ok(true);
    }
    if !a.get_type().is(b.get_type()) {
        return Ok(false);
    }
    a.eq(b).map_err(|err| {
        let type_name = |v: &Bound<'_, PyAny>| {
            v.get_type()
                .str()
                .map_or_else(|_| "?".to_owned(), |s| s.to_string())
        };
        PyValueError::new_err(format!(
            "static arguments should be comparable using __eq__.The following error was raised \
             when comparing two objects of types {} and {}. The error was:\n{err}",
            type_name(a),
            type_name(b)
        ))
    })
}

/// A leaf's part of a kept signature.
pub enum LeafKey {
    Array {
        aval: Py<PyAny>,
        value: Arc<AvalValue>,
        sharding: Py<PyAny>,
        sharding_id: ShardingId,
        committed: bool,
    },
    Host {
        dtype: DtypeKey,
        kind: HostKind,
        shape: Box<[usize]>,
    },
    Scalar(ScalarKind),
}

impl LeafKey {
    /// Whether `array`, a `jax.Array`, has this key: its aval, sharding and commitment.
    pub fn is_key_of(&self, h: &Handles, array: &Bound<'_, PyAny>) -> PyResult<bool> {
        let LeafKey::Array { committed, .. } = self else {
            return Ok(false);
        };
        let py = array.py();
        let aval = h.arrays.array_aval.bind(py).call1((array,))?;
        let sharding = h.arrays.array_sharding.bind(py).call1((array,))?;
        Ok(self.holds_array(&aval, &sharding)?
            && h.array_committed.bind(py).call1((array,))?.is_truthy()? == *committed)
    }

    /// Whether this is the key of an array of `aval` and `sharding` (commitment aside):
    /// compared by identity first, by value on a miss.
    pub fn holds_array(
        &self,
        live_aval: &Bound<'_, PyAny>,
        live_sharding: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let LeafKey::Array {
            aval,
            value,
            sharding,
            sharding_id: id,
            ..
        } = self
        else {
            return Ok(false);
        };
        Ok((aval.is(live_aval)
            || aval_value(live_aval)?.is_some_and(|live| live.as_ref() == value.as_ref()))
            && (sharding.is(live_sharding) || sharding_id(live_sharding)? == *id))
    }
}

/// The signature that a cache entry keeps.
pub struct CallSignature {
    pub hash: u64,
    num_args: usize,
    kwnames: Vec<Py<PyString>>,
    statics: Vec<Py<PyAny>>,
    static_names: Vec<Py<PyString>>,
    pub tree: Arc<Tree>,
    pub leaves: Vec<LeafKey>,
    context: Context,
    /// Whether the call was arrays alone, passed by position, with no static arguments.
    pub positional_arrays: bool,
}

impl CallSignature {
    /// The signature of `call`, whose hash is `hash`; None if a leaf's aval is not one the
    /// key holds.
    pub fn keep(call: &LiveCall<'_, '_>, hash: u64) -> PyResult<Option<Self>> {
        let mut leaves = Vec::with_capacity(call.keys.len());
        for (leaf, key) in call.leaves().iter().zip(&call.keys) {
            leaves.push(match key {
                LiveLeaf::Array {
                    aval,
                    sharding,
                    committed,
                } => {
                    let Some(value) = aval_value(aval)? else {
                        return Ok(None);
                    };
                    LeafKey::Array {
                        aval: aval.clone().unbind(),
                        value,
                        sharding: sharding.clone().unbind(),
                        sharding_id: sharding_id(sharding)?,
                        committed: *committed,
                    }
                }
                LiveLeaf::Host { dtype, kind, .. } => LeafKey::Host {
                    dtype: *dtype,
                    kind: *kind,
                    shape: host_shape(leaf).into(),
                },
                LiveLeaf::Scalar(kind) => LeafKey::Scalar(*kind),
            });
        }
        let unbind_all = |v: &[Bound<'_, PyString>]| v.iter().map(|n| n.clone().unbind()).collect();
        let positional_arrays = call.tree.flat
            && call.kwnames.is_empty()
            && call.statics.is_empty()
            && leaves.len() == call.num_args
            && leaves.iter().all(|l| matches!(l, LeafKey::Array { .. }));
        Ok(Some(Self {
            positional_arrays,
            hash,
            num_args: call.num_args,
            kwnames: unbind_all(&call.kwnames),
            statics: call.statics.iter().map(|s| s.clone().unbind()).collect(),
            static_names: unbind_all(&call.static_names),
            tree: Arc::clone(&call.tree),
            leaves,
            context: call.context.keep(),
        }))
    }

    /// Whether `call` has this signature. Raises JAX's error where comparing static
    /// arguments raises.
    /// Whether this is the signature of a call of `num_args` positional arguments, no keyword
    /// or static ones, under the jit key `context`.
    pub fn is_positional_under(&self, num_args: usize, context: &LiveContext<'_>) -> bool {
        self.num_args == num_args
            && self.kwnames.is_empty()
            && self.statics.is_empty()
            && self.static_names.is_empty()
            && context.is(&self.context)
    }

    pub fn matches(&self, call: &LiveCall<'_, '_>) -> PyResult<bool> {
        let py = call.context.py();
        if self.num_args != call.num_args
            || self.leaves.len() != call.keys.len()
            || !same_names(&self.kwnames, &call.kwnames)
            || !same_names(&self.static_names, &call.static_names)
            || self.statics.len() != call.statics.len()
        {
            return Ok(false);
        }
        if !(Arc::ptr_eq(&self.tree, &call.tree) || self.tree.same(py, &call.tree)?) {
            return Ok(false);
        }
        for ((kept, key), leaf) in self.leaves.iter().zip(&call.keys).zip(call.leaves()) {
            if !same_leaf(kept, key, leaf)? {
                return Ok(false);
            }
        }
        for (kept, value) in self.statics.iter().zip(&call.statics) {
            if !same_static(kept.bind(py), value)? {
                return Ok(false);
            }
        }
        Ok(call.context.is(&self.context))
    }

    /// Visits the caller's objects held: static arguments and the tree's.
    pub fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        for value in &self.statics {
            visit.call(value)?;
        }
        self.tree.traverse(visit)
    }
}

fn same_names(kept: &[Py<PyString>], names: &[Bound<'_, PyString>]) -> bool {
    kept.len() == names.len()
        && kept
            .iter()
            .zip(names)
            .all(|(a, b)| a.is(b) || a.bind(b.py()).as_any().eq(b).unwrap_or(false))
}

fn same_leaf(kept: &LeafKey, key: &LiveLeaf<'_>, leaf: &Bound<'_, PyAny>) -> PyResult<bool> {
    Ok(match (kept, key) {
        (
            LeafKey::Array { committed, .. },
            LiveLeaf::Array {
                aval: live_aval,
                sharding: live_sharding,
                committed: live_committed,
            },
        ) => committed == live_committed && kept.holds_array(live_aval, live_sharding)?,
        (
            LeafKey::Host { dtype, kind, shape },
            LiveLeaf::Host {
                dtype: live_dtype,
                kind: live_kind,
                ..
            },
        ) => {
            dtype == live_dtype
                && kind == live_kind
                && leaf.cast::<PyUntypedArray>().map_or(&[][..], |a| a.shape()) == &shape[..]
        }
        (LeafKey::Scalar(kind), LiveLeaf::Scalar(live)) => kind == live,
        _ => false,
    })
}
