//! The call signature as plain data, as JAX's jit keys a call (`jaxlib/jax_jit.h`'s
//! `CallSignature` and `ArgumentSignature`): what tells apart two calls that may need
//! different executables. Objects only Python can compare (static arguments, keyword names,
//! avals and shardings, the jit key) are handles `H`; everything else is data to read.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use rustc_hash::FxHasher;

/// A Python scalar's type; JAX gives bool no weak type and the others a weak one.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum ScalarKind {
    Bool,
    Int,
    Float,
    Complex,
}

impl ScalarKind {
    /// The Python type's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Bool => "bool",
            Self::Int => "int",
            Self::Float => "float",
            Self::Complex => "complex",
        }
    }

    /// Whether JAX gives a value of this kind a weak type.
    pub fn weak_type(self) -> bool {
        self != Self::Bool
    }
}

/// How a numpy value arrives: an array (whose contents may change between calls) or a
/// scalar (which cannot).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum HostKind {
    Array,
    Scalar,
}

/// A numpy dtype by value. Builtin numeric types and the types that packages register with
/// numpy (`ml_dtypes`' bfloat16, say) each have a type number of their own; with the item size
/// and a native byte order, it says which dtype this is.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct DtypeKey {
    /// numpy's type number.
    pub num: i32,
    pub itemsize: usize,
}

// numpy's type numbers of the dtypes that JAX can hold (longdouble, object, strings, dates and
// structured dtypes cannot), and the first number that packages' types get.
const NPY_BOOL_TO_CDOUBLE: std::ops::RangeInclusive<i32> = 0..=15;
const NPY_LONGDOUBLE: i32 = 13;
const NPY_HALF: i32 = 23;
const NPY_USERDEF: i32 = 256;

/// What a dtype descriptor says of itself, as numpy's `PyArray_Descr` has it.
#[derive(Clone, Copy, Debug)]
pub struct Descr {
    pub num: i32,
    pub itemsize: usize,
    /// `=`, `|`, `<` or `>`.
    pub byteorder: u8,
    pub has_fields: bool,
    pub has_subarray: bool,
}

impl DtypeKey {
    /// The key of a dtype, or None for one that JAX cannot hold or that the key would not
    /// tell apart (structured dtypes, a foreign byte order).
    pub fn of(descr: Descr) -> Option<Self> {
        let num = descr.num;
        let known = (NPY_BOOL_TO_CDOUBLE.contains(&num) && num != NPY_LONGDOUBLE)
            || num == NPY_HALF
            || num >= NPY_USERDEF;
        let native = match descr.byteorder {
            b'=' | b'|' => true,
            b'<' => cfg!(target_endian = "little"),
            b'>' => cfg!(target_endian = "big"),
            _ => false,
        };
        (known && native && !descr.has_fields && !descr.has_subarray).then_some(Self {
            num,
            itemsize: descr.itemsize,
        })
    }
}

/// An aval's value: what a call signature compares of a `jax.Array` besides its sharding.
#[derive(PartialEq, Eq, Debug)]
pub struct AvalValue {
    pub dtype: DtypeKey,
    pub shape: Box<[i64]>,
    pub weak_type: bool,
    pub hash: u64,
}

impl AvalValue {
    pub fn new(dtype: DtypeKey, shape: Box<[i64]>, weak_type: bool) -> Self {
        let mut hasher = FxHasher::default();
        (dtype, &shape, weak_type).hash(&mut hasher);
        Self {
            dtype,
            shape,
            weak_type,
            hash: hasher.finish(),
        }
    }
}

/// A sharding's value, as an id that every equal sharding shares.
pub type ShardingId = u64;

/// One flat argument's part of a call signature (JAX's `ArgumentSignature`, with the
/// sharding and commitment that `pjit.cc` adds).
#[derive(Debug)]
pub enum ArgSignature<H> {
    /// A `jax.Array`: its aval and sharding (handles, and their values), and commitment.
    Array {
        aval: H,
        value: Arc<AvalValue>,
        sharding: H,
        sharding_id: ShardingId,
        committed: bool,
    },
    /// A numpy array or scalar.
    Host {
        dtype: DtypeKey,
        kind: HostKind,
        shape: Box<[usize]>,
    },
    /// A Python scalar.
    Scalar(ScalarKind),
}

impl<H> ArgSignature<H> {
    pub fn is_array(&self) -> bool {
        matches!(self, Self::Array { .. })
    }

    /// The shape of the leaf: a Python scalar's is `()`.
    pub fn shape(&self) -> Vec<i64> {
        match self {
            Self::Array { value, .. } => value.shape.to_vec(),
            Self::Host { shape, .. } => shape
                .iter()
                .map(|&d| i64::try_from(d).unwrap_or(i64::MAX))
                .collect(),
            Self::Scalar(_) => Vec::new(),
        }
    }

    /// The signature's part of the call's hash, as `SignatureHasher` takes a live leaf.
    pub fn hash_into(&self, hasher: &mut SignatureHasher) {
        match self {
            Self::Array {
                value,
                sharding_id,
                committed,
                ..
            } => hasher.array(value.hash, *sharding_id, *committed),
            Self::Host { dtype, kind, shape } => hasher.host(*dtype, *kind, shape),
            Self::Scalar(kind) => hasher.scalar(*kind),
        }
    }
}

/// A live leaf as the caller read it, borrowed: what a kept `ArgSignature` is compared with.
/// `O` is a live object.
pub enum LiveArg<'a, O> {
    Array {
        aval: &'a O,
        sharding: &'a O,
        committed: bool,
    },
    Host {
        dtype: DtypeKey,
        kind: HostKind,
        shape: &'a [usize],
    },
    Scalar(ScalarKind),
}

/// What comparing a kept signature with a live call asks of the caller: the comparisons of
/// objects that only Python can make. `H` is a kept handle, `T` a tree, `C` a jit key.
pub trait Compare<H, T, C> {
    /// A live object: an aval, a sharding, a static argument.
    type Object;
    /// A live keyword or static argument name.
    type Name;
    type Error;
    /// Whether `kept` is `live` itself.
    fn is(&self, kept: &H, live: &Self::Object) -> bool;
    /// Whether two names are equal: the same object, or `==`.
    fn same_name(&self, kept: &H, live: &Self::Name) -> bool;
    /// Whether two static arguments are equal as JAX compares them: the same type, then `==`.
    fn same_static(&self, kept: &H, live: &Self::Object) -> Result<bool, Self::Error>;
    /// Whether two trees are equal (node data and dict keys compared by `==`).
    fn same_tree(&self, kept: &T, live: &T) -> Result<bool, Self::Error>;
    /// Whether the live call's jit key is `kept`.
    fn same_context(&self, kept: &C) -> bool;
    /// A live aval's value; None for an aval that a key does not hold.
    fn aval_value(&self, aval: &Self::Object) -> Result<Option<Arc<AvalValue>>, Self::Error>;
    /// A live sharding's value.
    fn sharding_id(&self, sharding: &Self::Object) -> Result<ShardingId, Self::Error>;
}

impl<H> ArgSignature<H> {
    /// Whether this is the key of an array of `aval` and `sharding` (commitment aside):
    /// compared by identity first, by value where identity differs.
    pub fn holds_array<T, C, X: Compare<H, T, C>>(
        &self,
        x: &X,
        live_aval: &X::Object,
        live_sharding: &X::Object,
    ) -> Result<bool, X::Error> {
        let Self::Array {
            aval,
            value,
            sharding,
            sharding_id,
            ..
        } = self
        else {
            return Ok(false);
        };
        Ok((x.is(aval, live_aval)
            || x.aval_value(live_aval)?
                .is_some_and(|live| *live == **value))
            && (x.is(sharding, live_sharding) || x.sharding_id(live_sharding)? == *sharding_id))
    }

    /// Whether the live leaf `live` has this key.
    pub fn holds<T, C, X: Compare<H, T, C>>(
        &self,
        x: &X,
        live: &LiveArg<'_, X::Object>,
    ) -> Result<bool, X::Error> {
        Ok(match (self, live) {
            (
                Self::Array { committed, .. },
                LiveArg::Array {
                    aval,
                    sharding,
                    committed: live_committed,
                },
            ) => committed == live_committed && self.holds_array(x, aval, sharding)?,
            (
                Self::Host { dtype, kind, shape },
                LiveArg::Host {
                    dtype: live_dtype,
                    kind: live_kind,
                    shape: live_shape,
                },
            ) => dtype == live_dtype && kind == live_kind && shape[..] == **live_shape,
            (Self::Scalar(kind), LiveArg::Scalar(live)) => kind == live,
            _ => false,
        })
    }
}

/// Whether `leaves` have the shapes `shapes`, in any order: a call that compile options for a
/// shape bucket may apply to. Compile options registered for a bucket forget the cache entries
/// that this picks; it may pick entries of other buckets too (dtypes, trees and static
/// arguments are not compared), whose next calls only miss again.
pub fn has_leaf_shapes<H>(leaves: &[ArgSignature<H>], shapes: &[Vec<i64>]) -> bool {
    if leaves.len() != shapes.len() {
        return false;
    }
    let mut ours: Vec<Vec<i64>> = leaves.iter().map(ArgSignature::shape).collect();
    let mut theirs = shapes.to_vec();
    ours.sort_unstable();
    theirs.sort_unstable();
    ours == theirs
}

/// The hash of a call signature, built from a live call's parts in order: the argument
/// counts, the names, the static arguments' hashes, the tree's hash, then each leaf.
#[derive(Default)]
pub struct SignatureHasher(FxHasher);

impl SignatureHasher {
    pub fn new(num_args: usize, num_kwargs: usize, num_static_names: usize) -> Self {
        let mut hasher = FxHasher::default();
        (num_args, num_kwargs, num_static_names).hash(&mut hasher);
        Self(hasher)
    }

    /// A keyword or static argument name's hash, or a static argument's.
    #[inline]
    pub fn object(&mut self, hash: isize) {
        hash.hash(&mut self.0);
    }

    #[inline]
    pub fn tree(&mut self, hash: u64) {
        hash.hash(&mut self.0);
    }

    #[inline]
    pub fn array(&mut self, aval_hash: u64, sharding_id: ShardingId, committed: bool) {
        (0u8, aval_hash, sharding_id, committed).hash(&mut self.0);
    }

    #[inline]
    pub fn host(&mut self, dtype: DtypeKey, kind: HostKind, shape: &[usize]) {
        (1u8, dtype, kind, shape).hash(&mut self.0);
    }

    #[inline]
    pub fn scalar(&mut self, kind: ScalarKind) {
        (2u8, kind).hash(&mut self.0);
    }

    pub fn finish(&self) -> u64 {
        self.0.finish()
    }
}

/// A live call as a kept signature compares it: its counts and names, static arguments, tree
/// and leaves (`I`, read as they are compared).
pub struct LiveSignature<'a, N, O, T, I> {
    pub num_args: usize,
    pub kwnames: &'a [N],
    pub statics: &'a [O],
    pub static_names: &'a [N],
    pub tree: &'a Arc<T>,
    pub leaves: I,
}

/// The signature that a cache entry keeps: `H` for the objects only Python compares, `T` the
/// tree of the dynamic arguments, `C` JAX's jit key.
pub struct CallSignature<H, T, C> {
    pub hash: u64,
    pub num_args: usize,
    /// Keyword arguments' names, sorted as JAX sorts them.
    pub kwnames: Vec<H>,
    pub statics: Vec<H>,
    pub static_names: Vec<H>,
    pub tree: Arc<T>,
    pub leaves: Vec<ArgSignature<H>>,
    pub context: C,
    /// Whether the call was arrays alone, passed by position, with no static arguments.
    pub positional_arrays: bool,
}

impl<H, T, C> CallSignature<H, T, C> {
    /// A signature; `flat` says whether the tree is the arguments themselves.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        hash: u64,
        num_args: usize,
        kwnames: Vec<H>,
        statics: Vec<H>,
        static_names: Vec<H>,
        tree: Arc<T>,
        flat: bool,
        leaves: Vec<ArgSignature<H>>,
        context: C,
    ) -> Self {
        let positional_arrays = flat
            && kwnames.is_empty()
            && statics.is_empty()
            && leaves.len() == num_args
            && leaves.iter().all(ArgSignature::is_array);
        Self {
            hash,
            num_args,
            kwnames,
            statics,
            static_names,
            tree,
            leaves,
            context,
            positional_arrays,
        }
    }

    /// Whether this is the signature of a call of `num_args` positional arguments and no
    /// keyword or static ones (the jit key is the caller's to compare).
    pub fn is_positional(&self, num_args: usize) -> bool {
        self.num_args == num_args
            && self.kwnames.is_empty()
            && self.statics.is_empty()
            && self.static_names.is_empty()
    }

    /// Whether `call` has this signature: the counts and names first, then the tree, each
    /// leaf, each static argument (JAX's error where comparing them raises), the jit key.
    pub fn matches<'a, X, I>(
        &self,
        x: &X,
        call: LiveSignature<'a, X::Name, X::Object, T, I>,
    ) -> Result<bool, X::Error>
    where
        X: Compare<H, T, C>,
        X::Object: 'a,
        I: ExactSizeIterator<Item = LiveArg<'a, X::Object>>,
    {
        let same_names = |kept: &[H], live: &[X::Name]| {
            kept.len() == live.len() && kept.iter().zip(live).all(|(a, b)| x.same_name(a, b))
        };
        if !self.has_counts(
            call.num_args,
            call.leaves.len(),
            call.kwnames.len(),
            call.statics.len(),
            call.static_names.len(),
        ) || !same_names(&self.kwnames, call.kwnames)
            || !same_names(&self.static_names, call.static_names)
        {
            return Ok(false);
        }
        if !(Arc::ptr_eq(&self.tree, call.tree) || x.same_tree(&self.tree, call.tree)?) {
            return Ok(false);
        }
        for (kept, live) in self.leaves.iter().zip(call.leaves) {
            if !kept.holds(x, &live)? {
                return Ok(false);
            }
        }
        for (kept, value) in self.statics.iter().zip(call.statics) {
            if !x.same_static(kept, value)? {
                return Ok(false);
            }
        }
        Ok(x.same_context(&self.context))
    }

    /// Whether a call of these counts may have this signature, before anything is compared.
    pub fn has_counts(
        &self,
        num_args: usize,
        num_leaves: usize,
        num_kwargs: usize,
        num_statics: usize,
        num_static_names: usize,
    ) -> bool {
        self.num_args == num_args
            && self.leaves.len() == num_leaves
            && self.kwnames.len() == num_kwargs
            && self.statics.len() == num_statics
            && self.static_names.len() == num_static_names
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const F32: DtypeKey = DtypeKey {
        num: 11,
        itemsize: 4,
    };

    fn descr(num: i32, byteorder: u8) -> Descr {
        Descr {
            num,
            itemsize: 4,
            byteorder,
            has_fields: false,
            has_subarray: false,
        }
    }

    #[test]
    fn leaf_shapes_match_in_any_order() {
        let array = |shape: &[i64]| ArgSignature::Array {
            aval: (),
            value: Arc::new(AvalValue::new(F32, shape.into(), false)),
            sharding: (),
            sharding_id: 0,
            committed: true,
        };
        let host = ArgSignature::Host {
            dtype: F32,
            kind: HostKind::Array,
            shape: vec![8, 1].into(),
        };
        let leaves = [array(&[4, 4]), ArgSignature::Scalar(ScalarKind::Int), host];
        assert!(has_leaf_shapes(&leaves, &[vec![4, 4], vec![], vec![8, 1]]));
        assert!(has_leaf_shapes(&leaves, &[vec![8, 1], vec![4, 4], vec![]]));
        assert!(!has_leaf_shapes(&leaves, &[vec![4, 4], vec![], vec![8, 2]]));
        assert!(!has_leaf_shapes(&leaves, &[vec![4, 4], vec![]]));
        assert!(!has_leaf_shapes(
            &leaves,
            &[vec![4, 4], vec![4, 4], vec![8, 1]]
        ));
        assert!(has_leaf_shapes::<()>(&[], &[]));
    }

    #[test]
    fn dtypes_jax_holds_have_keys() {
        assert_eq!(DtypeKey::of(descr(11, b'=')), Some(F32));
        assert_eq!(
            DtypeKey::of(descr(NPY_HALF, b'|')).map(|d| d.num),
            Some(NPY_HALF)
        );
        assert!(DtypeKey::of(descr(NPY_USERDEF + 3, b'=')).is_some());
        assert!(DtypeKey::of(descr(NPY_LONGDOUBLE, b'=')).is_none());
        assert!(DtypeKey::of(descr(17, b'=')).is_none(), "object dtype");
        let foreign = if cfg!(target_endian = "little") {
            b'>'
        } else {
            b'<'
        };
        assert!(DtypeKey::of(descr(11, foreign)).is_none());
        let structured = Descr {
            has_fields: true,
            ..descr(11, b'=')
        };
        assert!(DtypeKey::of(structured).is_none());
    }

    #[test]
    fn weak_types_of_python_scalars() {
        assert!(!ScalarKind::Bool.weak_type());
        assert!(ScalarKind::Int.weak_type());
        assert!(ScalarKind::Complex.weak_type());
    }

    fn array(shape: Vec<i64>, sharding_id: ShardingId, committed: bool) -> ArgSignature<()> {
        ArgSignature::Array {
            aval: (),
            value: Arc::new(AvalValue::new(F32, shape.into(), false)),
            sharding: (),
            sharding_id,
            committed,
        }
    }

    fn signature(leaves: Vec<ArgSignature<()>>, kwnames: usize) -> CallSignature<(), (), ()> {
        let num_args = leaves.len() - kwnames;
        CallSignature::new(
            0,
            num_args,
            vec![(); kwnames],
            vec![],
            vec![],
            Arc::new(()),
            true,
            leaves,
            (),
        )
    }

    #[test]
    fn positional_arrays_are_arrays_by_position_alone() {
        assert!(signature(vec![array(vec![2], 1, false)], 0).positional_arrays);
        assert!(!signature(vec![array(vec![2], 1, false)], 1).positional_arrays);
        assert!(!signature(vec![ArgSignature::Scalar(ScalarKind::Int)], 0).positional_arrays);
        let sig = signature(vec![array(vec![2], 1, false), array(vec![], 1, true)], 0);
        assert!(sig.is_positional(2));
        assert!(!sig.is_positional(1));
        assert!(sig.has_counts(2, 2, 0, 0, 0));
        assert!(!sig.has_counts(2, 2, 1, 0, 0));
    }

    fn leaf() -> impl Strategy<Value = ArgSignature<()>> {
        prop_oneof![
            (prop::collection::vec(0i64..5, 0..3), 0u64..3, any::<bool>())
                .prop_map(|(shape, id, committed)| array(shape, id, committed)),
            (prop::collection::vec(0usize..5, 0..3), any::<bool>()).prop_map(|(shape, scalar)| {
                ArgSignature::Host {
                    dtype: F32,
                    kind: if scalar {
                        HostKind::Scalar
                    } else {
                        HostKind::Array
                    },
                    shape: shape.into(),
                }
            }),
            prop_oneof![
                Just(ScalarKind::Bool),
                Just(ScalarKind::Int),
                Just(ScalarKind::Float)
            ]
            .prop_map(ArgSignature::Scalar),
        ]
    }

    fn key(leaf: &ArgSignature<()>) -> (u8, u64, u64, bool, Vec<usize>, Option<ScalarKind>) {
        match leaf {
            ArgSignature::Array {
                value,
                sharding_id,
                committed,
                ..
            } => (0, value.hash, *sharding_id, *committed, vec![], None),
            ArgSignature::Host { kind, shape, .. } => {
                (1, 0, 0, *kind == HostKind::Scalar, shape.to_vec(), None)
            }
            ArgSignature::Scalar(kind) => (2, 0, 0, false, vec![], Some(*kind)),
        }
    }

    fn hash(leaves: &[ArgSignature<()>]) -> u64 {
        let mut hasher = SignatureHasher::new(leaves.len(), 0, 0);
        hasher.tree(7);
        for leaf in leaves {
            leaf.hash_into(&mut hasher);
        }
        hasher.finish()
    }

    proptest! {
        /// Equal signatures hash equal; signatures that hash equal are, but for collisions
        /// that these few leaves never have, equal.
        #[test]
        fn the_hash_tells_leaves_apart(a in prop::collection::vec(leaf(), 0..4), b in prop::collection::vec(leaf(), 0..4)) {
            let same = a.len() == b.len() && a.iter().zip(&b).all(|(x, y)| key(x) == key(y));
            prop_assert_eq!(hash(&a) == hash(&b), same);
        }

        /// A kept leaf hashes as the live call it was kept from.
        #[test]
        fn kept_leaves_hash_as_live_ones(shape in prop::collection::vec(0usize..9, 0..4)) {
            let kept: ArgSignature<()> = ArgSignature::Host { dtype: F32, kind: HostKind::Array, shape: shape.clone().into() };
            let mut live = SignatureHasher::new(1, 0, 0);
            live.host(F32, HostKind::Array, &shape);
            let mut from_kept = SignatureHasher::new(1, 0, 0);
            kept.hash_into(&mut from_kept);
            prop_assert_eq!(live.finish(), from_kept.finish());
        }
    }

    /// Objects are strings, `is` is the same string in memory, and an object's value is
    /// its text up to a `#` (so `a#1` and `a#2` are other objects of one value).
    struct Plain {
        context: u32,
    }

    fn value_of(object: &str) -> &str {
        object.split('#').next().unwrap_or(object)
    }

    impl Compare<&'static str, String, u32> for Plain {
        type Object = &'static str;
        type Name = &'static str;
        type Error = String;

        fn is(&self, kept: &&'static str, live: &&'static str) -> bool {
            std::ptr::eq(*kept, *live)
        }

        fn same_name(&self, kept: &&'static str, live: &&'static str) -> bool {
            kept == live
        }

        fn same_static(&self, kept: &&'static str, live: &&'static str) -> Result<bool, String> {
            if *live == "raises" {
                return Err("== raised".into());
            }
            Ok(value_of(kept) == value_of(live))
        }

        fn same_tree(&self, kept: &String, live: &String) -> Result<bool, String> {
            Ok(kept == live)
        }

        fn same_context(&self, kept: &u32) -> bool {
            *kept == self.context
        }

        fn aval_value(&self, aval: &&'static str) -> Result<Option<Arc<AvalValue>>, String> {
            let dims = value_of(aval).split('x').map(|d| d.parse().unwrap_or(-1));
            Ok(Some(Arc::new(AvalValue::new(F32, dims.collect(), false))))
        }

        fn sharding_id(&self, sharding: &&'static str) -> Result<ShardingId, String> {
            Ok(value_of(sharding).len() as ShardingId)
        }
    }

    fn kept_array(aval: &'static str, sharding: &'static str) -> ArgSignature<&'static str> {
        let Ok(Some(value)) = Plain { context: 0 }.aval_value(&aval) else {
            unreachable!()
        };
        ArgSignature::Array {
            aval,
            value,
            sharding,
            sharding_id: value_of(sharding).len() as ShardingId,
            committed: false,
        }
    }

    #[test]
    fn a_leaf_holds_live_objects_by_identity_or_by_value() {
        let x = Plain { context: 0 };
        let (aval, sharding) = ("4x2#1", "rows#1");
        let key = kept_array(aval, sharding);
        let live = |aval, sharding, committed| LiveArg::Array {
            aval,
            sharding,
            committed,
        };
        assert_eq!(key.holds(&x, &live(&aval, &sharding, false)), Ok(true));
        // Other objects of equal values.
        assert_eq!(key.holds(&x, &live(&"4x2#2", &"rows#2", false)), Ok(true));
        // Another shape, sharding or commitment.
        assert_eq!(key.holds(&x, &live(&"8x2", &sharding, false)), Ok(false));
        assert_eq!(key.holds(&x, &live(&aval, &"columns", false)), Ok(false));
        assert_eq!(key.holds(&x, &live(&aval, &sharding, true)), Ok(false));
        // Host values by dtype, kind and shape; scalars by kind; kinds apart.
        let host = ArgSignature::<&str>::Host {
            dtype: F32,
            kind: HostKind::Array,
            shape: [2, 3].into(),
        };
        let live_host = |shape| LiveArg::Host {
            dtype: F32,
            kind: HostKind::Array,
            shape,
        };
        assert_eq!(host.holds(&x, &live_host(&[2, 3])), Ok(true));
        assert_eq!(host.holds(&x, &live_host(&[3, 2])), Ok(false));
        let scalar = ArgSignature::<&str>::Scalar(ScalarKind::Float);
        assert_eq!(
            scalar.holds(&x, &LiveArg::Scalar(ScalarKind::Float)),
            Ok(true)
        );
        assert_eq!(
            scalar.holds(&x, &LiveArg::Scalar(ScalarKind::Int)),
            Ok(false)
        );
        assert_eq!(
            key.holds(&x, &LiveArg::Scalar(ScalarKind::Float)),
            Ok(false)
        );
    }

    /// A call's keyword names, static arguments and tree, and whether it has the signature.
    type Case<'a> = (
        &'a [&'static str],
        &'a [&'static str],
        &'a Arc<String>,
        bool,
    );

    #[test]
    fn a_call_matches_a_signature_in_every_part_or_not_at_all() {
        let tree = Arc::new("(*, *)".to_owned());
        let signature = CallSignature::new(
            0,
            2,
            vec!["b"],
            vec!["3#kept"],
            vec!["n"],
            Arc::clone(&tree),
            false,
            vec![
                kept_array("4", "rows"),
                ArgSignature::Scalar(ScalarKind::Int),
            ],
            7u32,
        );
        let leaves = || {
            [
                LiveArg::Array {
                    aval: &"4#live",
                    sharding: &"rows#live",
                    committed: false,
                },
                LiveArg::Scalar(ScalarKind::Int),
            ]
            .into_iter()
        };
        let other_tree = Arc::new("(*, [*])".to_owned());
        let call = |kwnames, statics, tree| LiveSignature {
            num_args: 2,
            kwnames,
            statics,
            static_names: &["n"],
            tree,
            leaves: leaves(),
        };
        let x = Plain { context: 7 };
        // A tree equal by value, not the same one.
        let equal_tree = Arc::new("(*, *)".to_owned());
        let cases: [Case<'_>; 6] = [
            (&["b"], &["3#live"], &tree, true),
            (&["b"], &["3"], &equal_tree, true),
            (&["c"], &["3"], &tree, false),
            (&["b"], &["4"], &tree, false),
            (&["b"], &["3"], &other_tree, false),
            (&["b"], &[], &tree, false),
        ];
        for (kwnames, statics, tree, expected) in cases {
            assert_eq!(
                signature.matches(&x, call(kwnames, statics, tree)),
                Ok(expected)
            );
        }
        let other_key = Plain { context: 8 };
        assert_eq!(
            signature.matches(&other_key, call(&["b"], &["3"], &tree)),
            Ok(false)
        );
        // Comparing static arguments raises where `==` raises.
        assert!(signature
            .matches(&x, call(&["b"], &["raises"], &tree))
            .is_err());
        // A leaf of another kind.
        let mut fewer = call(&["b"], &["3"], &tree);
        fewer.leaves = [
            LiveArg::Scalar(ScalarKind::Int),
            LiveArg::Scalar(ScalarKind::Int),
        ]
        .into_iter();
        assert_eq!(signature.matches(&x, fewer), Ok(false));
    }
}
