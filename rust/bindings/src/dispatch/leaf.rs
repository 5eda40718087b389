//! One flattened argument of a call as the call signature sees it: a `jax.Array` by its aval,
//! sharding and commitment; a numpy array or scalar by dtype value and shape; a Python scalar
//! by its type, which gives its dtype and weak type. Avals and shardings are compared by
//! identity first and by value on a miss; their value hashes are remembered per object, in a
//! bounded memo that holds every object it remembers. A function also remembers its latest
//! calls' arrays, two by position (`SeenArrays`), so that a call that passes one of them again
//! reads nothing of it.

use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError};

use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyComplex, PyFloat, PyInt, PyTuple, PyWeakrefReference};
use pyo3::PyTraverseError;
use rustc_hash::{FxBuildHasher, FxHashMap, FxHasher};

use crate::handles::{names, Handles};

/// A Python scalar's type; JAX gives bool no weak type and the others a weak one.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum ScalarKind {
    Bool,
    Int,
    Float,
    Complex,
}

/// A numpy dtype by value. Builtin numeric types and the types that packages register with
/// numpy (`ml_dtypes`' bfloat16, say) each have a type number of their own; with the item size
/// and a native byte order, it says which dtype this is.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct DtypeKey {
    num: i32,
    itemsize: usize,
}

// numpy's type numbers of the dtypes that JAX can hold (longdouble, object, strings, dates and
// structured dtypes cannot), and the first number that packages' types get.
const NPY_BOOL_TO_CDOUBLE: std::ops::RangeInclusive<i32> = 0..=15;
const NPY_LONGDOUBLE: i32 = 13;
const NPY_HALF: i32 = 23;
const NPY_USERDEF: i32 = 256;

impl DtypeKey {
    /// The key of `descr`, or None for a dtype that JAX cannot hold or that the key would not
    /// tell apart (structured dtypes, a foreign byte order).
    pub fn of(descr: &Bound<'_, PyArrayDescr>) -> Option<Self> {
        let num = descr.num();
        let known = (NPY_BOOL_TO_CDOUBLE.contains(&num) && num != NPY_LONGDOUBLE)
            || num == NPY_HALF
            || num >= NPY_USERDEF;
        let native = match descr.byteorder() {
            b'=' | b'|' => true,
            b'<' => cfg!(target_endian = "little"),
            b'>' => cfg!(target_endian = "big"),
            _ => false,
        };
        (known && native && !descr.has_fields() && !descr.has_subarray()).then(|| Self {
            num,
            itemsize: descr.itemsize(),
        })
    }
}

/// How a numpy value arrives: an array (whose contents may change between calls) or a
/// scalar (which cannot).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum HostKind {
    Array,
    Scalar,
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
    /// Reads `leaf`; None for a value the dispatcher does not key (a tracer, a PRNG key array,
    /// an object JAX rejects), which JAX's own path handles.
    pub fn read(h: &Handles, leaf: &Bound<'py, PyAny>) -> PyResult<Option<Self>> {
        let py = leaf.py();
        let kind = leaf.get_type_ptr();
        if std::ptr::eq(kind, h.arrays.array_impl.as_ptr().cast()) {
            return Self::array(h, leaf).map(Some);
        }
        if let Some(kind) = scalar_kind(leaf) {
            return Ok(Some(Self::Scalar(kind)));
        }
        // Subclasses of ndarray (masked arrays, say) are left to JAX.
        if std::ptr::eq(kind, h.arrays.ndarray.as_ptr().cast()) {
            let array = leaf.cast::<PyUntypedArray>()?;
            return Ok(DtypeKey::of(&array.dtype()).map(|dtype| Self::Host {
                dtype,
                kind: HostKind::Array,
                descr: None,
            }));
        }
        if leaf.is_instance(h.arrays.numpy_scalar.bind(py))? {
            let descr = leaf
                .getattr(names(py).dtype.bind(py))?
                .cast_into::<PyArrayDescr>()?;
            return Ok(DtypeKey::of(&descr).map(|dtype| Self::Host {
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

/// The arrays of a function's latest calls, two by position among its flat leaves (so that
/// calls that alternate between two arrays find both), with what the call signature reads of
/// each: its aval, sharding and commitment, which are fixed for the array's life. A call that
/// passes one of those arrays again reads nothing of it.
///
/// An array is held by a weak reference, which tells it apart from a new array at its
/// address once it is gone. A reference is made only for an array found at an address that
/// one of the two latest calls had at its position, so that calls with new arrays every time
/// (batches) make none. A loop whose new arrays take the addresses that its old ones freed (a
/// donated state, whose arrays alternate between two addresses) makes a reference or two at a
/// position, then none: an address where a held array was found replaced by a new one is
/// held again only when two calls in a row pass an array there.
#[derive(Default)]
pub struct SeenArrays {
    slots: Vec<[Seen; 2]>,
}

#[derive(Default)]
enum Seen {
    #[default]
    Nothing,
    /// An array was at this address, and is not held; `hold` is false where a held array was
    /// found replaced by a new one (see above).
    At { address: usize, hold: bool },
    Held {
        address: usize,
        array: Py<PyWeakrefReference>,
        aval: Py<PyAny>,
        sharding: Py<PyAny>,
        committed: bool,
    },
}

impl Seen {
    fn address(&self) -> Option<usize> {
        match self {
            Self::Nothing => None,
            Self::At { address, .. } | Self::Held { address, .. } => Some(*address),
        }
    }
}

/// How many positions a function remembers arrays at.
const SEEN_POSITIONS: usize = 1 << 16;

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
        let pair = self.slots.get_mut(position)?;
        let i = pair.iter().position(|seen| match seen {
            Seen::Held { array, .. } => refers_to(array, leaf),
            _ => false,
        })?;
        if i != 0 {
            pair.swap(0, i);
        }
        let Seen::Held {
            aval,
            sharding,
            committed,
            ..
        } = &pair[0]
        else {
            return None;
        };
        Some(LiveLeaf::Array {
            aval: aval.bind(leaf.py()).clone(),
            sharding: sharding.bind(leaf.py()).clone(),
            committed: *committed,
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
        if position >= SEEN_POSITIONS
            || !std::ptr::eq(leaf.get_type_ptr(), h.arrays.array_impl.as_ptr().cast())
        {
            return LiveLeaf::read(h, leaf);
        }
        if self.slots.len() <= position {
            self.slots.resize_with(position + 1, Default::default);
        }
        let pair = &mut self.slots[position];
        let live = LiveLeaf::array(h, leaf)?;
        let address = id(leaf);
        let found = pair.iter().position(|s| s.address() == Some(address));
        // The address of the latest call's array, or of the call's before where no held
        // array has been replaced.
        let hold = matches!(
            found.map(|i| (i, &pair[i])),
            Some((0, Seen::At { .. }) | (_, Seen::At { hold: true, .. }))
        );
        let seen = match &live {
            LiveLeaf::Array {
                aval,
                sharding,
                committed,
            } if hold => Seen::Held {
                address,
                array: PyWeakrefReference::new(leaf)?.unbind(),
                aval: aval.clone().unbind(),
                sharding: sharding.clone().unbind(),
                committed: *committed,
            },
            _ => Seen::At {
                address,
                // Not where a held array was just replaced by a new one, or one was before.
                hold: !matches!(
                    found.map(|i| &pair[i]),
                    Some(Seen::Held { .. } | Seen::At { hold: false, .. })
                ),
            },
        };
        // The new memory goes first; the one it replaces, or else the older one, goes.
        let replaced = if found == Some(0) {
            std::mem::replace(&mut pair[0], seen)
        } else {
            let older = std::mem::replace(&mut pair[0], seen);
            std::mem::replace(&mut pair[1], older)
        };
        drop(replaced);
        Ok(Some(live))
    }

    /// How many arrays are held.
    pub fn held(&self) -> usize {
        self.slots
            .iter()
            .flatten()
            .filter(|s| matches!(s, Seen::Held { .. }))
            .count()
    }

    /// Visits the objects held: weak references, avals and shardings.
    pub fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        for slot in self.slots.iter().flatten() {
            if let Seen::Held {
                array,
                aval,
                sharding,
                ..
            } = slot
            {
                visit.call(array)?;
                visit.call(aval)?;
                visit.call(sharding)?;
            }
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

/// An aval's value: what a call signature compares of a `jax.Array` besides its sharding.
#[derive(PartialEq, Eq, Debug)]
pub struct AvalValue {
    pub dtype: DtypeKey,
    pub shape: Box<[i64]>,
    pub weak_type: bool,
    pub hash: u64,
}

impl AvalValue {
    /// The value of `aval` (a `ShapedArray`); None for dtypes the key does not hold.
    pub fn of(aval: &Bound<'_, PyAny>) -> PyResult<Option<Self>> {
        let py = aval.py();
        let Ok(descr) = aval
            .getattr(names(py).dtype.bind(py))?
            .cast_into::<PyArrayDescr>()
        else {
            return Ok(None);
        };
        let Some(dtype) = DtypeKey::of(&descr) else {
            return Ok(None);
        };
        let shape: Box<[i64]> = aval
            .getattr(names(py).shape.bind(py))?
            .cast_into::<PyTuple>()?
            .extract::<Vec<i64>>()?
            .into();
        let weak_type = aval.getattr(names(py).weak_type.bind(py))?.is_truthy()?;
        let mut hasher = FxHasher::default();
        (dtype, &shape, weak_type).hash(&mut hasher);
        Ok(Some(Self {
            dtype,
            shape,
            weak_type,
            hash: hasher.finish(),
        }))
    }
}

type Memo<V> = FxHashMap<usize, (Py<PyAny>, V)>;

/// A sharding's value, as an id that every equal sharding shares.
pub type ShardingId = u64;

/// Avals and shardings by identity, each with what comparing and hashing it needs; bounded,
/// and holding every object it has, so that an identity stays valid while it is a key here.
/// Shardings also have a representative per value: a sharding object seen for the first time
/// is compared by `==` with the representatives of its hash, and takes the id of the one it
/// equals, so that later comparisons of shardings are comparisons of ids.
struct LeafMemo {
    avals: Memo<Arc<AvalValue>>,
    shardings: Memo<ShardingId>,
    representatives: FxHashMap<isize, Vec<(Py<PyAny>, ShardingId)>>,
    next_id: ShardingId,
}

const MEMO_AVALS: usize = 8192;
const MEMO_SHARDINGS: usize = 2048;
const MEMO_SHARDING_VALUES: usize = 1024;

static MEMO: Mutex<Option<LeafMemo>> = Mutex::new(None);

fn with_memo<R>(f: impl FnOnce(&mut LeafMemo) -> R) -> R {
    let mut guard = MEMO.lock().unwrap_or_else(PoisonError::into_inner);
    let memo = guard.get_or_insert_with(|| LeafMemo {
        avals: Memo::with_capacity_and_hasher(64, FxBuildHasher),
        shardings: Memo::with_capacity_and_hasher(16, FxBuildHasher),
        representatives: FxHashMap::default(),
        next_id: 0,
    });
    f(memo)
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
                    .avals
                    .get(&id(aval))
                    .zip(memo.shardings.get(&id(sharding)))
                    .map(|((_, aval), (_, sharding))| (aval.hash, *sharding)),
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
    if let Some(value) = with_memo(|memo| memo.avals.get(&id(aval)).map(|(_, v)| v.clone())) {
        return Ok(Some(value));
    }
    let Some(value) = AvalValue::of(aval)? else {
        return Ok(None);
    };
    let value = Arc::new(value);
    let evicted = with_memo(|memo| remember(&mut memo.avals, aval, value.clone(), MEMO_AVALS));
    // Released outside the lock: freeing an object can run Python.
    drop(evicted);
    Ok(Some(value))
}

/// The id of `sharding`'s value, remembered.
pub fn sharding_id(sharding: &Bound<'_, PyAny>) -> PyResult<ShardingId> {
    if let Some(id) = with_memo(|memo| memo.shardings.get(&id(sharding)).map(|(_, i)| *i)) {
        return Ok(id);
    }
    let py = sharding.py();
    let hash = sharding.hash()?;
    let representatives: Vec<(Py<PyAny>, ShardingId)> = with_memo(|memo| {
        memo.representatives
            .get(&hash)
            .map_or_else(Vec::new, |found| {
                found.iter().map(|(r, i)| (r.clone_ref(py), *i)).collect()
            })
    });
    let mut found = None;
    for (representative, id) in &representatives {
        if representative.bind(py).eq(sharding)? {
            found = Some(*id);
            break;
        }
    }
    let evicted = with_memo(|memo| {
        let mut evicted = Vec::new();
        let id = found.unwrap_or_else(|| {
            if memo.representatives.values().map(Vec::len).sum::<usize>() >= MEMO_SHARDING_VALUES {
                // Every id is new after this; signatures kept with old ones miss, no more.
                evicted.extend(
                    memo.representatives
                        .drain()
                        .flat_map(|(_, v)| v)
                        .map(|(r, _)| r),
                );
            }
            memo.next_id += 1;
            let id = memo.next_id;
            memo.representatives
                .entry(hash)
                .or_default()
                .push((sharding.clone().unbind(), id));
            id
        });
        evicted.extend(remember(&mut memo.shardings, sharding, id, MEMO_SHARDINGS));
        (id, evicted)
    });
    let (id, evicted) = evicted;
    drop(evicted);
    Ok(id)
}

/// Remembers `value` for `obj`; when full, forgets everything first, and returns what it held.
fn remember<V>(
    memo: &mut Memo<V>,
    obj: &Bound<'_, PyAny>,
    value: V,
    capacity: usize,
) -> Vec<Py<PyAny>> {
    let evicted = if memo.len() >= capacity {
        memo.drain().map(|(_, (obj, _))| obj).collect()
    } else {
        Vec::new()
    };
    memo.insert(id(obj), (obj.clone().unbind(), value));
    evicted
}

/// Forgets every aval and sharding remembered (`jax.clear_caches()`).
pub fn clear_memo() {
    let evicted = with_memo(|memo| {
        let mut evicted: Vec<Py<PyAny>> = memo.avals.drain().map(|(_, (o, _))| o).collect();
        evicted.extend(memo.shardings.drain().map(|(_, (o, _))| o));
        evicted.extend(
            memo.representatives
                .drain()
                .flat_map(|(_, v)| v)
                .map(|(r, _)| r),
        );
        evicted
    });
    drop(evicted);
}

pub fn memo_sizes() -> (usize, usize) {
    with_memo(|memo| (memo.avals.len(), memo.shardings.len()))
}

fn id(obj: &Bound<'_, PyAny>) -> usize {
    obj.as_ptr() as usize
}
