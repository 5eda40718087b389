//! The cache key of a call: what JAX's jit keys its executables on. Static arguments by hash
//! and equality, the argument tree, each leaf's type, shape, dtype, weak type, sharding and
//! commitment, and JAX's trace context (x64, meshes in context, ...).

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyComplex, PyFloat, PyInt, PyTuple};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use super::fast::Structure;
use super::handles::Handles;
use crate::cache::BoundedCache;

/// A Python object compared by identity first, then by `==`, with its Python hash.
pub struct Hashed {
    pub obj: Py<PyAny>,
    pub hash: isize,
}

impl Hashed {
    pub fn new(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(Self {
            hash: obj.hash()?,
            obj: obj.clone().unbind(),
        })
    }

    fn matches(&self, py: Python<'_>, other: &Self) -> PyResult<bool> {
        if self.obj.is(&other.obj) {
            return Ok(true);
        }
        Ok(self.hash == other.hash && self.obj.bind(py).eq(other.obj.bind(py))?)
    }
}

/// The hashes of sharding objects by identity (held, so the identity stays valid): JAX's
/// shardings hash in Python, and an array's sharding object is shared by many arrays.
static SHARDING_HASHES: BoundedCache<usize, Arc<(Py<PyAny>, isize)>> = BoundedCache::new(1024);

/// A sharding as a key, its hash computed once per sharding object.
fn sharding_key(sharding: &Bound<'_, PyAny>) -> PyResult<Hashed> {
    let id = sharding.as_ptr() as usize;
    let hash = if let Some(entry) = SHARDING_HASHES.get(&id) {
        entry.1
    } else {
        let hash = sharding.hash()?;
        SHARDING_HASHES.insert(id, Arc::new((sharding.clone().unbind(), hash)));
        hash
    };
    Ok(Hashed {
        obj: sharding.clone().unbind(),
        hash,
    })
}

/// How one flattened argument enters the executable.
pub enum LeafKind {
    /// A `jax.Array`; the sharding is compared by identity, then equality. The aval is kept
    /// for the identity checks of the fast path.
    Array {
        sharding: Hashed,
        committed: bool,
        aval: Py<PyAny>,
    },
    /// A numpy array or numpy scalar, placed by the Rust shard path.
    Numpy,
    /// A Python bool, int, float or complex (weakly typed, but for bool).
    Scalar,
}

pub struct LeafSignature {
    pub kind: LeafKind,
    /// The dtype object's identity; JAX's and numpy's dtypes are interned.
    pub dtype: usize,
    pub shape: Vec<i64>,
    pub weak_type: bool,
}

/// The tree of a call's dynamic arguments: as Rust flattened it (builtin containers around
/// plain leaves), or as JAX's pytree registry did (a `PyTreeDef`).
pub enum Tree {
    Rust(Arc<Structure>),
    Jax(Hashed),
}

impl Tree {
    fn hash_into(&self, py: Python<'_>, hasher: &mut impl Hasher) -> PyResult<()> {
        match self {
            Self::Rust(structure) => structure.key_hash(py, hasher),
            Self::Jax(treedef) => {
                treedef.hash.hash(hasher);
                Ok(())
            }
        }
    }

    fn matches(&self, py: Python<'_>, other: &Self) -> PyResult<bool> {
        match (self, other) {
            (Self::Rust(a), Self::Rust(b)) => a.same(py, b),
            (Self::Jax(a), Self::Jax(b)) => a.matches(py, b),
            _ => Ok(false),
        }
    }
}

/// The whole key of one call.
pub struct Signature {
    pub statics: Vec<Hashed>,
    pub tree: Tree,
    pub leaves: Vec<LeafSignature>,
    pub context: Hashed,
    pub hash: u64,
    /// Whether the call had positional arguments only, and no static ones.
    pub positional_only: bool,
}

/// Why a call cannot be keyed: it must go to JAX.
pub enum Unkeyable {
    /// A leaf that is not a concrete array or scalar: a tracer, or a bad input JAX reports.
    Leaf,
    /// A static argument without a hash; JAX raises the error.
    UnhashableStatic,
}

impl Signature {
    /// Keys a call whose dynamic leaves are `leaves`, with tree `tree` and static arguments
    /// `statics`; `positional_only` says the call had no keywords and no static arguments.
    /// `Err(Unkeyable)` for calls that JAX must run.
    pub fn new(
        py: Python<'_>,
        h: &Handles,
        statics: &[Bound<'_, PyAny>],
        tree: Tree,
        leaves: &[Bound<'_, PyAny>],
        positional_only: bool,
    ) -> PyResult<Result<Self, Unkeyable>> {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        let mut static_keys = Vec::with_capacity(statics.len());
        for s in statics {
            match Hashed::new(s) {
                Ok(k) => {
                    k.hash.hash(&mut hasher);
                    static_keys.push(k);
                }
                Err(_) => return Ok(Err(Unkeyable::UnhashableStatic)),
            }
        }
        tree.hash_into(py, &mut hasher)?;
        let context = Hashed::new(h.jit_key(py)?.as_any())?;
        context.hash.hash(&mut hasher);
        let mut keys = Vec::with_capacity(leaves.len());
        for leaf in leaves {
            let Some(key) = leaf_signature(py, h, leaf)? else {
                return Ok(Err(Unkeyable::Leaf));
            };
            key.dtype.hash(&mut hasher);
            key.shape.hash(&mut hasher);
            key.weak_type.hash(&mut hasher);
            if let LeafKind::Array {
                sharding,
                committed,
                ..
            } = &key.kind
            {
                sharding.hash.hash(&mut hasher);
                committed.hash(&mut hasher);
            }
            keys.push(key);
        }
        Ok(Ok(Self {
            statics: static_keys,
            tree,
            leaves: keys,
            context,
            hash: hasher.finish(),
            positional_only,
        }))
    }

    /// Whether two keys are equal (their hashes being equal already).
    pub fn matches(&self, py: Python<'_>, other: &Self) -> PyResult<bool> {
        if self.hash != other.hash
            || self.leaves.len() != other.leaves.len()
            || self.statics.len() != other.statics.len()
        {
            return Ok(false);
        }
        for (a, b) in self.leaves.iter().zip(&other.leaves) {
            if a.dtype != b.dtype || a.weak_type != b.weak_type || a.shape != b.shape {
                return Ok(false);
            }
            let same_kind = match (&a.kind, &b.kind) {
                (
                    LeafKind::Array {
                        sharding: sa,
                        committed: ca,
                        ..
                    },
                    LeafKind::Array {
                        sharding: sb,
                        committed: cb,
                        ..
                    },
                ) => ca == cb && sa.matches(py, sb)?,
                (LeafKind::Numpy, LeafKind::Numpy) | (LeafKind::Scalar, LeafKind::Scalar) => true,
                _ => false,
            };
            if !same_kind {
                return Ok(false);
            }
        }
        // As in JAX, equal static arguments of different types (1, 1.0, True) are different
        // keys: each may trace to a different program.
        for (a, b) in self.statics.iter().zip(&other.statics) {
            if !a.obj.bind(py).get_type().is(b.obj.bind(py).get_type()) || !a.matches(py, b)? {
                return Ok(false);
            }
        }
        Ok(self.tree.matches(py, &other.tree)? && self.context.matches(py, &other.context)?)
    }
}

/// The signature of one leaf, or `None` for a leaf that JAX must handle (a tracer, say).
fn leaf_signature(
    py: Python<'_>,
    h: &Handles,
    leaf: &Bound<'_, PyAny>,
) -> PyResult<Option<LeafSignature>> {
    let kind = leaf.get_type();
    if kind.is(h.array_impl.bind(py)) {
        let aval = h.array_aval.bind(py).call1((leaf,))?;
        let shape = aval.getattr(intern!(py, "shape"))?;
        return Ok(Some(LeafSignature {
            dtype: aval.getattr(intern!(py, "dtype"))?.as_ptr() as usize,
            shape: shape.cast::<PyTuple>()?.extract()?,
            weak_type: aval.getattr(intern!(py, "weak_type"))?.is_truthy()?,
            kind: LeafKind::Array {
                sharding: sharding_key(&h.array_sharding.bind(py).call1((leaf,))?)?,
                committed: h.array_committed.bind(py).call1((leaf,))?.is_truthy()?,
                aval: aval.clone().unbind(),
            },
        }));
    }
    if leaf.is_instance(h.ndarray.bind(py))? || leaf.is_instance(h.numpy_scalar.bind(py))? {
        let dtype = leaf.getattr(intern!(py, "dtype"))?;
        return Ok(Some(LeafSignature {
            dtype: dtype.as_ptr() as usize,
            shape: leaf.getattr(intern!(py, "shape"))?.extract()?,
            weak_type: false,
            kind: LeafKind::Numpy,
        }));
    }
    // Python scalars: the type decides the dtype; bool is not weakly typed in JAX.
    let scalar_type = if leaf.is_instance_of::<PyBool>() {
        Some((1usize, false))
    } else if leaf.is_instance_of::<PyInt>() {
        Some((2, true))
    } else if leaf.is_instance_of::<PyFloat>() {
        Some((3, true))
    } else if leaf.is_instance_of::<PyComplex>() {
        Some((4, true))
    } else {
        None
    };
    Ok(scalar_type.map(|(code, weak_type)| LeafSignature {
        dtype: code,
        shape: Vec::new(),
        weak_type,
        kind: LeafKind::Scalar,
    }))
}
