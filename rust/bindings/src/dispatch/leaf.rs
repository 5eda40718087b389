//! One flattened argument of a call as the call signature sees it: a `jax.Array` by its aval,
//! sharding and commitment; a numpy array or scalar by dtype value and shape; a Python scalar
//! by its type, which gives its dtype and weak type. Avals and shardings are compared by
//! identity first and by value on a miss; their value hashes are remembered per object, in a
//! bounded memo that holds every object it remembers. A function also remembers its latest
//! calls' arrays, two by position (`SeenArrays`), so that a call that passes one of them again
//! reads nothing of it.

use std::sync::{Arc, Mutex, PoisonError};

use fastpjit_core::dispatch::memo::LeafMemo;
use fastpjit_core::dispatch::seen::SeenArrays as Remembered;
use fastpjit_core::dispatch::signature::LiveArg;
pub use fastpjit_core::dispatch::{AvalValue, DtypeKey, HostKind, ScalarKind, ShardingId};
use fastpjit_core::dispatch::{Descr, SEEN_POSITIONS};
use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyComplex, PyFloat, PyInt, PyTuple, PyWeakrefReference};
use pyo3::PyTraverseError;

use crate::handles::{names, Handles};

/// The key of `descr` (see `DtypeKey::of`).
pub fn dtype_key(descr: &Bound<'_, PyArrayDescr>) -> Option<DtypeKey> {
    DtypeKey::of(Descr {
        num: descr.num(),
        itemsize: descr.itemsize(),
        byteorder: descr.byteorder(),
        has_fields: descr.has_fields(),
        has_subarray: descr.has_subarray(),
    })
}

/// One leaf of a call, read once.
pub enum LiveLeaf<'py> {
    Array {
        aval: Bound<'py, PyAny>,
        sharding: Bound<'py, PyAny>,
        committed: bool,
    },
    Host {
        dtype: DtypeKey,
        kind: HostKind,
        /// The numpy scalar's dtype object, whose value bits key device copies of the scalar.
        descr: Option<Bound<'py, PyArrayDescr>>,
    },
    Scalar(ScalarKind),
}

impl<'py> LiveLeaf<'py> {
    /// The leaf `leaf`, read as this, as a kept signature compares it.
    pub fn as_arg<'a>(&'a self, leaf: &'a Bound<'py, PyAny>) -> LiveArg<'a, Bound<'py, PyAny>> {
        match self {
            Self::Array {
                aval,
                sharding,
                committed,
            } => LiveArg::Array {
                aval,
                sharding,
                committed: *committed,
            },
            Self::Host { dtype, kind, .. } => LiveArg::Host {
                dtype: *dtype,
                kind: *kind,
                shape: host_shape(leaf),
            },
            Self::Scalar(kind) => LiveArg::Scalar(*kind),
        }
    }

    /// Reads `leaf`; None for a value the dispatcher does not key (a tracer, a PRNG key array,
    /// an object JAX rejects), which JAX's own path handles.
    pub fn read(h: &Handles, leaf: &Bound<'py, PyAny>) -> PyResult<Option<Self>> {
        let py = leaf.py();
        if h.is_array(leaf) {
            return Self::array(h, leaf).map(Some);
        }
        let kind = leaf.get_type_ptr();
        if let Some(kind) = scalar_kind(leaf) {
            return Ok(Some(Self::Scalar(kind)));
        }
        // Subclasses of ndarray (masked arrays, say) are left to JAX.
        if std::ptr::eq(kind, h.arrays.ndarray.as_ptr().cast()) {
            let array = leaf.cast::<PyUntypedArray>()?;
            return Ok(dtype_key(&array.dtype()).map(|dtype| Self::Host {
                dtype,
                kind: HostKind::Array,
                descr: None,
            }));
        }
        if leaf.is_instance(h.arrays.numpy_scalar.bind(py))? {
            let descr = leaf
                .getattr(names(py).dtype.bind(py))?
                .cast_into::<PyArrayDescr>()?;
            return Ok(dtype_key(&descr).map(|dtype| Self::Host {
                dtype,
                kind: HostKind::Scalar,
                descr: Some(descr),
            }));
        }
        Ok(None)
    }

    /// Reads `array`, a `jax.Array` (`ArrayImpl`).
    fn array(h: &Handles, array: &Bound<'py, PyAny>) -> PyResult<Self> {
        let py = array.py();
        Ok(Self::Array {
            aval: h.arrays.array_aval.bind(py).call1((array,))?,
            sharding: h.arrays.array_sharding.bind(py).call1((array,))?,
            committed: h.array_committed.bind(py).call1((array,))?.is_truthy()?,
        })
    }
}

/// The arrays of a function's latest calls, as the core's rules remember them (see
/// `fastpjit_core::dispatch::seen`), each with what the call signature reads of it.
#[derive(Default)]
pub struct SeenArrays(Remembered<HeldArray>);

/// An array held by weak reference, with its aval, sharding and commitment.
pub struct HeldArray {
    array: Py<PyWeakrefReference>,
    aval: Py<PyAny>,
    sharding: Py<PyAny>,
    committed: bool,
}

impl SeenArrays {
    /// Reads a call's leaves, as `read` does each one; None if JAX must handle one of them.
    pub fn read_all<'py>(
        &mut self,
        h: &Handles,
        leaves: &[Bound<'py, PyAny>],
    ) -> PyResult<Option<Vec<LiveLeaf<'py>>>> {
        let mut keys = Vec::with_capacity(leaves.len());
        while keys.len() < leaves.len() {
            // The common case, arrays held, has a loop of its own, which writes their keys in
            // place (a push would build each on the stack and copy it).
            let mut known = keys.len();
            for (slot, leaf) in keys.spare_capacity_mut().iter_mut().zip(&leaves[known..]) {
                let Some(live) = self.remembered(known, leaf) else {
                    break;
                };
                slot.write(live);
                known += 1;
            }
            // SAFETY: the elements up to `known` were written above, within the capacity.
            unsafe { keys.set_len(known) };
            if let Some(leaf) = leaves.get(known) {
                let Some(key) = self.read_unremembered(h, known, leaf)? else {
                    return Ok(None);
                };
                keys.push(key);
            }
        }
        Ok(Some(keys))
    }

    /// `leaf` as remembered, where it is an array held at `position`; the array found
    /// second moves first.
    #[inline]
    fn remembered<'py>(
        &mut self,
        position: usize,
        leaf: &Bound<'py, PyAny>,
    ) -> Option<LiveLeaf<'py>> {
        // A dead weak reference's referent is None, which a live array never is.
        if leaf.is_none() {
            return None;
        }
        let held = self
            .0
            .remembered(position, |held| refers_to(&held.array, leaf))?;
        Some(LiveLeaf::Array {
            aval: held.aval.bind(leaf.py()).clone(),
            sharding: held.sharding.bind(leaf.py()).clone(),
            committed: held.committed,
        })
    }

    /// Reads `leaf`, the call's leaf at `position`, as `LiveLeaf::read` does.
    pub fn read<'py>(
        &mut self,
        h: &Handles,
        position: usize,
        leaf: &Bound<'py, PyAny>,
    ) -> PyResult<Option<LiveLeaf<'py>>> {
        match self.remembered(position, leaf) {
            Some(live) => Ok(Some(live)),
            None => self.read_unremembered(h, position, leaf),
        }
    }

    /// Reads `leaf`, which is no array held at `position`, and remembers it there if it is
    /// an array.
    fn read_unremembered<'py>(
        &mut self,
        h: &Handles,
        position: usize,
        leaf: &Bound<'py, PyAny>,
    ) -> PyResult<Option<LiveLeaf<'py>>> {
        if position >= SEEN_POSITIONS || !h.is_array(leaf) {
            return LiveLeaf::read(h, leaf);
        }
        let live = LiveLeaf::array(h, leaf)?;
        let address = id(leaf);
        let held = match &live {
            LiveLeaf::Array {
                aval,
                sharding,
                committed,
            } if self.0.holds(position, address) => Some(HeldArray {
                array: PyWeakrefReference::new(leaf)?.unbind(),
                aval: aval.clone().unbind(),
                sharding: sharding.clone().unbind(),
                committed: *committed,
            }),
            _ => None,
        };
        let replaced = self.0.remember(position, address, held);
        drop(replaced);
        Ok(Some(live))
    }

    /// How many arrays are held.
    pub fn held(&self) -> usize {
        self.0.held()
    }

    /// Visits the objects held: weak references, avals and shardings.
    pub fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        for held in self.0.records() {
            visit.call(&held.array)?;
            visit.call(&held.aval)?;
            visit.call(&held.sharding)?;
        }
        Ok(())
    }
}

/// Whether `weak` refers to `object`, which is alive and not None. The referent's address is
/// read and compared, never followed: the interpreter sets it to None when the referent dies.
#[inline]
pub fn refers_to(weak: &Py<PyWeakrefReference>, object: &Bound<'_, PyAny>) -> bool {
    // SAFETY: `weak` is a live weak reference, held by the caller; only its referent's
    // address is read.
    unsafe { (*weak.as_ptr().cast::<pyo3::ffi::PyWeakReference>()).wr_object == object.as_ptr() }
}

/// The kind of a Python scalar of an exact builtin type (subclasses, such as enums, are left
/// to JAX).
pub fn scalar_kind(leaf: &Bound<'_, PyAny>) -> Option<ScalarKind> {
    if leaf.is_exact_instance_of::<PyFloat>() {
        Some(ScalarKind::Float)
    } else if leaf.is_exact_instance_of::<PyInt>() {
        Some(ScalarKind::Int)
    } else if leaf.is_exact_instance_of::<PyBool>() {
        Some(ScalarKind::Bool)
    } else if leaf.is_exact_instance_of::<PyComplex>() {
        Some(ScalarKind::Complex)
    } else {
        None
    }
}

/// The shape of a numpy leaf (a scalar's is empty).
pub fn host_shape<'a>(leaf: &'a Bound<'_, PyAny>) -> &'a [usize] {
    leaf.cast::<PyUntypedArray>()
        .map_or(&[], |array| array.shape())
}

/// The value of `aval` (a `ShapedArray`); None for dtypes the key does not hold.
fn read_aval(aval: &Bound<'_, PyAny>) -> PyResult<Option<AvalValue>> {
    let py = aval.py();
    let Ok(descr) = aval
        .getattr(names(py).dtype.bind(py))?
        .cast_into::<PyArrayDescr>()
    else {
        return Ok(None);
    };
    let Some(dtype) = dtype_key(&descr) else {
        return Ok(None);
    };
    let shape: Box<[i64]> = aval
        .getattr(names(py).shape.bind(py))?
        .cast_into::<PyTuple>()?
        .extract::<Vec<i64>>()?
        .into();
    let weak_type = aval.getattr(names(py).weak_type.bind(py))?.is_truthy()?;
    Ok(Some(AvalValue::new(dtype, shape, weak_type)))
}

/// The avals and shardings remembered (see the core's `LeafMemo`).
static MEMO: Mutex<Option<LeafMemo<Py<PyAny>>>> = Mutex::new(None);

fn with_memo<R>(f: impl FnOnce(&mut LeafMemo<Py<PyAny>>) -> R) -> R {
    let mut guard = MEMO.lock().unwrap_or_else(PoisonError::into_inner);
    f(guard.get_or_insert_with(LeafMemo::default))
}

/// The value hash of each array leaf's aval and its sharding's id, `(0, 0)` at other leaves;
/// None if an aval is not one the key holds. Objects new to the memo are read outside its
/// lock: reading them runs Python.
pub fn array_hashes(leaves: &[LiveLeaf<'_>]) -> PyResult<Option<Vec<(u64, ShardingId)>>> {
    let mut hashes = Vec::with_capacity(leaves.len());
    let mut unknown = Vec::new();
    with_memo(|memo| {
        for (i, leaf) in leaves.iter().enumerate() {
            let known = match leaf {
                LiveLeaf::Array { aval, sharding, .. } => memo
                    .aval(id(aval))
                    .zip(memo.sharding(id(sharding)))
                    .map(|(aval, sharding)| (aval.hash, sharding)),
                _ => Some((0, 0)),
            };
            hashes.push(known.unwrap_or_default());
            if known.is_none() {
                unknown.push(i);
            }
        }
    });
    for i in unknown {
        let LiveLeaf::Array { aval, sharding, .. } = &leaves[i] else {
            continue;
        };
        let Some(value) = aval_value(aval)? else {
            return Ok(None);
        };
        hashes[i] = (value.hash, sharding_id(sharding)?);
    }
    Ok(Some(hashes))
}

/// The value of `aval`, remembered.
pub fn aval_value(aval: &Bound<'_, PyAny>) -> PyResult<Option<Arc<AvalValue>>> {
    if let Some(value) = with_memo(|memo| memo.aval(id(aval)).cloned()) {
        return Ok(Some(value));
    }
    let Some(value) = read_aval(aval)? else {
        return Ok(None);
    };
    let value = Arc::new(value);
    let released =
        with_memo(|memo| memo.remember_aval(id(aval), aval.clone().unbind(), value.clone()));
    // Released outside the lock: freeing an object can run Python.
    drop(released);
    Ok(Some(value))
}

/// The id of `sharding`'s value, remembered.
pub fn sharding_id(sharding: &Bound<'_, PyAny>) -> PyResult<ShardingId> {
    let address = id(sharding);
    if let Some(id) = with_memo(|memo| memo.sharding(address)) {
        return Ok(id);
    }
    let py = sharding.py();
    let hash = sharding.hash()?;
    let representatives: Vec<(Py<PyAny>, ShardingId)> = with_memo(|memo| {
        memo.representatives(hash)
            .map(|(r, id)| (r.clone_ref(py), id))
            .collect()
    });
    // `==` runs Python, outside the lock.
    let mut equal = None;
    for (representative, id) in &representatives {
        if representative.bind(py).eq(sharding)? {
            equal = Some(*id);
            break;
        }
    }
    let (id, released) = with_memo(|memo| {
        let object = sharding.clone().unbind();
        memo.remember_sharding(address, hash, object, equal, || sharding.clone().unbind())
    });
    // Released after the lock: freeing Python objects can run Python.
    drop((released, representatives));
    Ok(id)
}

/// Forgets the avals and shardings that the dispatcher remembers (`jax.clear_caches()`).
#[pyfunction]
pub fn clear_dispatch_memo() {
    let released = with_memo(LeafMemo::clear);
    drop(released);
}

/// How many avals and shardings the dispatcher remembers.
#[pyfunction]
pub fn dispatch_memo_sizes() -> (usize, usize) {
    with_memo(|memo| memo.sizes())
}

fn id(obj: &Bound<'_, PyAny>) -> usize {
    obj.as_ptr() as usize
}
