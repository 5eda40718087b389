//! The call signature: what tells apart two calls that may need different executables, as
//! JAX's jit keys them (`jaxlib/pjit.cc`'s `CallSignature`). Static arguments by type, hash
//! and `==`, positional and keyword ones apart; keyword arguments by name; the tree of the
//! dynamic arguments; each leaf's signature (see `leaf`); and JAX's jit key (see `context`).
//!
//! A call is read into a `LiveCall`, which borrows the call's objects; a cache entry keeps a
//! `CallSignature` (the core's plain data, with handles to the objects it compares). A hit
//! compares the two without building a signature, as the core's `CallSignature::matches`
//! decides: by identity first, by value only where identity differs. `PyCompare` makes the
//! comparisons that only Python can.

use std::borrow::Cow;
use std::sync::Arc;

use fastpjit_core::dispatch::route::is_static_position;
use fastpjit_core::dispatch::signature::{Compare, LiveSignature};
use fastpjit_core::dispatch::{
    self, ArgSignature, AvalValue, ShardingId, SignatureHasher, Unkeyable,
};

use pyo3::exceptions::PyTypeError;
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};
use pyo3::PyTraverseError;

use super::context::{Context, LiveContext};
use super::leaf::{array_hashes, aval_value, host_shape, sharding_id, LiveLeaf};
use super::tree::Tree;
use crate::errors::{refusal, DispatchError};
use crate::handles::Handles;

/// Which arguments are static, as the jitted function declares them.
pub struct StaticArgs {
    /// Positions; a negative one counts from the end of the call's positional arguments.
    pub argnums: Vec<isize>,
    pub argnames: Vec<Py<PyString>>,
}

impl StaticArgs {
    pub fn is_empty(&self) -> bool {
        self.argnums.is_empty() && self.argnames.is_empty()
    }
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
            if is_static_position(&statics.argnums, i, num_args) {
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
        let mut hasher =
            SignatureHasher::new(self.num_args, self.kwnames.len(), self.static_names.len());
        for name in self.kwnames.iter().chain(&self.static_names) {
            hasher.object(name.hash()?);
        }
        for value in &self.statics {
            match value.hash() {
                Ok(hash) => hasher.object(hash),
                Err(err) if err.is_instance_of::<PyTypeError>(value.py()) => {
                    return Ok(Err(Unkeyable::UnhashableStatic));
                }
                Err(err) => return Err(err),
            }
        }
        hasher.tree(self.tree.hash);
        let Some(arrays) = array_hashes(&self.keys)? else {
            return Ok(Err(Unkeyable::Leaf));
        };
        for ((leaf, key), (aval_hash, sharding)) in self.leaves().iter().zip(&self.keys).zip(arrays)
        {
            match key {
                LiveLeaf::Array { committed, .. } => hasher.array(aval_hash, sharding, *committed),
                LiveLeaf::Host { dtype, kind, .. } => hasher.host(*dtype, *kind, host_shape(leaf)),
                LiveLeaf::Scalar(kind) => hasher.scalar(*kind),
            }
        }
        Ok(Ok(hasher.finish()))
    }
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
        refusal(DispatchError::StaticComparison {
            types: (type_name(a), type_name(b)),
            error: err.to_string(),
        })
    })
}

/// A leaf's part of a kept signature.
pub type LeafKey = ArgSignature<Py<PyAny>>;

/// The signature that a cache entry keeps.
pub type CallSignature = dispatch::CallSignature<Py<PyAny>, Tree, Context>;

/// The comparisons of a kept signature with a live call that only Python makes (see the
/// core's `Compare`), under the live call's jit key.
pub struct PyCompare<'a, 'py> {
    py: Python<'py>,
    context: Option<&'a LiveContext<'py>>,
}

impl<'a, 'py> PyCompare<'a, 'py> {
    /// For a call under `context`.
    pub fn under(context: &'a LiveContext<'py>) -> Self {
        Self {
            py: context.py(),
            context: Some(context),
        }
    }

    /// For leaves alone: no jit key is compared.
    pub fn leaves(py: Python<'py>) -> Self {
        Self { py, context: None }
    }
}

impl<'py> Compare<Py<PyAny>, Tree, Context> for PyCompare<'_, 'py> {
    type Object = Bound<'py, PyAny>;
    type Name = Bound<'py, PyString>;
    type Error = PyErr;

    fn is(&self, kept: &Py<PyAny>, live: &Bound<'py, PyAny>) -> bool {
        kept.is(live)
    }

    fn same_name(&self, kept: &Py<PyAny>, live: &Bound<'py, PyString>) -> bool {
        kept.is(live) || kept.bind(self.py).eq(live).unwrap_or(false)
    }

    fn same_static(&self, kept: &Py<PyAny>, live: &Bound<'py, PyAny>) -> PyResult<bool> {
        same_static(kept.bind(self.py), live)
    }

    fn same_tree(&self, kept: &Tree, live: &Tree) -> PyResult<bool> {
        kept.same(self.py, live)
    }

    fn same_context(&self, kept: &Context) -> bool {
        self.context.is_some_and(|context| context.is(kept))
    }

    fn aval_value(&self, aval: &Bound<'py, PyAny>) -> PyResult<Option<Arc<AvalValue>>> {
        aval_value(aval)
    }

    fn sharding_id(&self, sharding: &Bound<'py, PyAny>) -> PyResult<ShardingId> {
        sharding_id(sharding)
    }
}

/// Whether `array`, a `jax.Array`, has the key `key`: its aval, sharding and commitment.
pub fn is_key_of(key: &LeafKey, h: &Handles, array: &Bound<'_, PyAny>) -> PyResult<bool> {
    let LeafKey::Array { committed, .. } = key else {
        return Ok(false);
    };
    let py = array.py();
    let aval = h.arrays.array_aval.bind(py).call1((array,))?;
    let sharding = h.arrays.array_sharding.bind(py).call1((array,))?;
    Ok(key.holds_array(&PyCompare::leaves(py), &aval, &sharding)?
        && h.array_committed.bind(py).call1((array,))?.is_truthy()? == *committed)
}

/// The signature of `call`, whose hash is `hash`; None if a leaf's aval is not one the key
/// holds.
pub fn keep(call: &LiveCall<'_, '_>, hash: u64) -> PyResult<Option<CallSignature>> {
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
    let unbind_all = |v: &[Bound<'_, PyAny>]| v.iter().map(|n| n.clone().unbind()).collect();
    let names =
        |v: &[Bound<'_, PyString>]| v.iter().map(|n| n.clone().into_any().unbind()).collect();
    Ok(Some(CallSignature::new(
        hash,
        call.num_args,
        names(&call.kwnames),
        unbind_all(&call.statics),
        names(&call.static_names),
        Arc::clone(&call.tree),
        call.tree.flat,
        leaves,
        call.context.keep(),
    )))
}

/// Whether `signature` is that of a call of `num_args` positional arguments, no keyword or
/// static ones, under the jit key `context`.
pub fn is_positional_under(
    signature: &CallSignature,
    num_args: usize,
    context: &LiveContext<'_>,
) -> bool {
    signature.is_positional(num_args) && context.is(&signature.context)
}

/// Whether `call` has `signature` (see the core's `CallSignature::matches`). Raises JAX's
/// error where comparing static arguments raises.
pub fn matches(signature: &CallSignature, call: &LiveCall<'_, '_>) -> PyResult<bool> {
    let live = LiveSignature {
        num_args: call.num_args,
        kwnames: &call.kwnames,
        statics: &call.statics,
        static_names: &call.static_names,
        tree: &call.tree,
        leaves: call
            .keys
            .iter()
            .zip(call.leaves())
            .map(|(k, l)| k.as_arg(l)),
    };
    signature.matches(&PyCompare::under(&call.context), live)
}

/// Visits the caller's objects that `signature` holds: static arguments and the tree's.
pub fn traverse(signature: &CallSignature, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
    for value in &signature.statics {
        visit.call(value)?;
    }
    signature.tree.traverse(visit)
}

/// Binding logic that reads Python objects, tested with the project's interpreter (`make
/// rust-test-bindings`).
#[cfg(test)]
mod tests {
    use pyo3::types::PyDictMethods;

    use super::*;
    use crate::handles::handles;

    fn ints(values: &[Bound<'_, PyAny>]) -> Vec<i64> {
        values.iter().map(|v| v.extract().unwrap()).collect()
    }

    fn strs(values: &[Bound<'_, PyString>]) -> Vec<String> {
        values.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_call_splits_into_static_and_dynamic_arguments_keywords_by_name() {
        Python::initialize();
        Python::attach(|py| {
            let statics = StaticArgs {
                argnums: vec![1, -1],
                argnames: vec![PyString::new(py, "n").unbind()],
            };
            let args = PyTuple::new(py, [10, 11, 12, 13]).unwrap();
            let kwargs = PyDict::new(py);
            for (name, value) in [("b", 2), ("n", 5), ("a", 1)] {
                kwargs.set_item(name, value).unwrap();
            }
            let call =
                LiveCall::split(&statics, &args, Some(&kwargs), LiveContext::none(py)).unwrap();
            // Positional dynamic arguments, then keyword ones sorted by name, as JAX orders
            // them; a negative static position counts from the end.
            assert_eq!(ints(call.dynamic()), [10, 12, 1, 2]);
            assert_eq!(strs(&call.kwnames), ["a", "b"]);
            assert_eq!(ints(&call.statics), [11, 13, 5]);
            assert_eq!(strs(&call.static_names), ["n"]);
            assert_eq!(call.num_args, 4);
            // A call of positional dynamic arguments only borrows the argument tuple.
            let none = StaticArgs {
                argnums: Vec::new(),
                argnames: Vec::new(),
            };
            let plain = LiveCall::split(&none, &args, None, LiveContext::none(py)).unwrap();
            assert!(plain.dynamic().as_ptr() == args.as_slice().as_ptr());
        });
    }

    /// A call of `args`, `kwargs` read as the dispatcher reads it: split, flattened, leaves
    /// read.
    fn read<'py>(
        py: Python<'py>,
        statics: &StaticArgs,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> LiveCall<'static, 'py> {
        let h = handles(py).unwrap();
        let mut call = LiveCall::split(statics, args, kwargs, LiveContext::none(py)).unwrap();
        let Ok((tree, leaves)) = Tree::derive(py, h, call.dynamic()).unwrap() else {
            panic!("a keyable call");
        };
        let keys = super::super::leaf::SeenArrays::default()
            .read_all(h, &leaves)
            .unwrap()
            .unwrap();
        let nested = (!tree.flat).then_some(leaves);
        call.set_tree(Cow::Owned(Arc::new(tree)), nested, keys);
        call
    }

    #[test]
    fn a_call_matches_the_signature_kept_from_an_equal_call_only() {
        Python::initialize();
        Python::attach(equal_calls_match);
    }

    /// A call has the signature kept from an equal call, and not those of other calls.
    fn equal_calls_match<'py>(py: Python<'py>) {
        let jnp = py.import("jax.numpy").unwrap();
        let np = py.import("numpy").unwrap();
        let statics = StaticArgs {
            argnums: vec![2],
            argnames: Vec::new(),
        };
        // f({"w": array, "b": None}, numpy array, static, 1.5)
        let call_of = |n: i64, static_value: &str, scalar: Bound<'py, PyAny>| {
            let tree = PyDict::new(py);
            tree.set_item("w", jnp.call_method1("ones", (n,)).unwrap())
                .unwrap();
            tree.set_item("b", py.None()).unwrap();
            let host = np.call_method1("zeros", (3,)).unwrap();
            PyTuple::new(
                py,
                [
                    tree.into_any(),
                    host,
                    PyString::new(py, static_value).into_any(),
                    scalar,
                ],
            )
            .unwrap()
        };
        let float = || 1.5f64.into_pyobject(py).unwrap().into_any();
        let first = call_of(4, "mode", float());
        let call = read(py, &statics, &first, None);
        let Ok(hash) = call.hash().unwrap() else {
            panic!("a hashable call");
        };
        let signature = keep(&call, hash).unwrap().unwrap();
        assert!(matches(&signature, &call).unwrap());
        // Other objects of equal values, an equal static made anew: the same signature.
        let equal = call_of(4, &(String::from("mo") + "de"), float());
        assert!(matches(&signature, &read(py, &statics, &equal, None)).unwrap());
        // Another shape, another static value, an int where a float was: not.
        for other in [
            call_of(5, "mode", float()),
            call_of(4, "other", float()),
            call_of(4, "mode", 2i64.into_pyobject(py).unwrap().into_any()),
        ] {
            assert!(!matches(&signature, &read(py, &statics, &other, None)).unwrap());
        }
        // The same arguments passed by keyword have another signature.
        let kwargs = PyDict::new(py);
        kwargs.set_item("x", float()).unwrap();
        let fewer = PyTuple::new(py, first.iter().take(3)).unwrap();
        assert!(!matches(&signature, &read(py, &statics, &fewer, Some(&kwargs))).unwrap());
    }

    #[test]
    fn an_array_has_the_key_of_its_aval_sharding_and_commitment_only() {
        Python::initialize();
        Python::attach(|py| {
            let h = handles(py).unwrap();
            let jax = py.import("jax").unwrap();
            let jnp = py.import("jax.numpy").unwrap();
            let x = jnp.call_method1("ones", (4,)).unwrap();
            let key_of = |array: &Bound<'_, PyAny>, committed: bool| {
                let aval = h.arrays.array_aval.bind(py).call1((array,)).unwrap();
                let sharding = h.arrays.array_sharding.bind(py).call1((array,)).unwrap();
                LeafKey::Array {
                    value: aval_value(&aval).unwrap().unwrap(),
                    sharding_id: sharding_id(&sharding).unwrap(),
                    aval: aval.unbind(),
                    sharding: sharding.unbind(),
                    committed,
                }
            };
            let key = key_of(&x, false);
            assert!(is_key_of(&key, h, &x).unwrap());
            // An equal array (another aval and sharding object, equal values) has it too.
            let y = jnp.call_method1("zeros", (4,)).unwrap();
            assert!(is_key_of(&key, h, &y).unwrap());
            // Another shape, or the same array committed, has not.
            let longer = jnp.call_method1("ones", (5,)).unwrap();
            assert!(!is_key_of(&key, h, &longer).unwrap());
            let device = jax.call_method0("devices").unwrap().get_item(0).unwrap();
            let committed = jax.call_method1("device_put", (&x, device)).unwrap();
            assert!(!is_key_of(&key, h, &committed).unwrap());
            assert!(is_key_of(&key_of(&committed, true), h, &committed).unwrap());
        });
    }
}
