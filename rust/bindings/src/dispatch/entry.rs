//! A cached executable, and how each argument of a call that hits it becomes an input: an
//! array on the executable's input sharding passes as it is, an array on another single device
//! is copied by jaxlib (or its copy from the call before is used again), an array elsewhere is
//! moved by JAX, and a host value (a scalar, a numpy array) comes from a device copy of the
//! same bytes kept from an earlier call, or else is placed by the Rust shard path.

use std::sync::{Mutex, PoisonError};

use fastpjit_core::dispatch::plan::{self, ArrayInput, InputPlan, OutputForm};
use fastpjit_core::timing::Stage;
use fastpjit_core::{Copied, HitInputs, KeptValues, LatestCopy};
use numpy::npyffi::{NPY_ORDER, PY_ARRAY_API};
use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyComplex, PyDict, PyFloat, PyInt, PyList, PyTuple, PyWeakrefReference};
use pyo3::PyTraverseError;

use super::leaf::{refers_to, HostKind, LiveLeaf, ScalarKind};
use super::miss::{Conversion, FastPath};
use super::signature::{CallSignature, LeafKey, LiveCall};
use super::tree::Tree;
use crate::errors::{refusal, DispatchError};
use crate::handles::{names, Handles};
use crate::process_local::make_array_from_process_local_leaf;
use crate::stats::{mark, Clock};
use crate::transfer::{deleted_error, HostInput};

/// How a hit's arguments became inputs.
#[derive(Default)]
pub struct Took {
    /// Whether JAX moved an argument.
    pub moved: bool,
    pub inputs: HitInputs,
    /// The call's stage times, where it is timed (`fastpjit.timing`).
    pub clock: Option<Clock>,
}

/// How one flat argument becomes an executable input (see the core's `plan::Input`): a copy
/// with its targets, a move to a sharding, a host value's placement, or for a pmap across
/// processes the global aval and sharding of this process's part.
type Input = plan::Input<CopyInput, Py<PyAny>, HostArg, GlobalPart>;
type Plan = InputPlan<CopyInput, Py<PyAny>, HostArg, GlobalPart>;
/// The aval and sharding of the global array that a process-local value is part of.
type GlobalPart = (Py<PyAny>, Py<PyAny>);

/// The device lists, shardings and copy semantics that jaxlib's batched copy takes.
type CopyTargets = (Py<PyAny>, Py<PyAny>, Py<PyAny>);

/// How `leaf`, an array on sharding `own`, becomes an input on `sharding` (JAX's
/// `array_input` says); `donated` if the executable consumes it.
fn array_input(
    h: &Handles,
    leaf: &Bound<'_, PyAny>,
    own: &Bound<'_, PyAny>,
    sharding: Py<PyAny>,
    donated: bool,
) -> PyResult<Input> {
    let py = leaf.py();
    let ndim = leaf.getattr(names(py).ndim.bind(py))?;
    let (how, copy): (String, Option<CopyTargets>) = h
        .array_input
        .bind(py)
        .call1((own, &sharding, ndim))?
        .extract()?;
    let nbytes: usize = leaf.getattr(names(py).nbytes.bind(py))?.extract()?;
    Ok(
        match (ArrayInput::of(&how, copy.is_some(), nbytes, donated), copy) {
            (ArrayInput::Pass, _) => Input::Pass,
            (ArrayInput::Copy { keep_latest }, Some(targets)) => Input::Copy(CopyInput {
                targets,
                latest: keep_latest.then(Mutex::default),
            }),
            _ => Input::Move(sharding),
        },
    )
}

/// An array argument that jaxlib copies to the executable's device, with the copy of the
/// latest array passed again (see `LatestCopy`).
struct CopyInput {
    targets: CopyTargets,
    /// None for a donated argument, whose copy the executable consumes, and for large arrays.
    latest: Option<Mutex<LatestCopy<Py<PyWeakrefReference>, Py<PyAny>>>>,
}

/// A host argument, placed as planned, or taken from device copies of its recent values.
struct HostArg {
    host: HostInput,
    /// None for a donated argument, whose buffer the executable consumes.
    kept: Option<Mutex<KeptValues<Py<PyAny>>>>,
}

/// The largest numpy array whose values are kept on the device: comparing its bytes costs
/// far less than placing it, and an argument keeps at most four.
const KEPT_ARRAY_BYTES: usize = 1024;

/// How the outputs, as the executable gives them (a list), become the call's result.
type Outputs = OutputForm<Tree, Py<PyAny>>;

pub struct Entry {
    execute_sharded: Py<PyAny>,
    outputs: Outputs,
    out_handlers: Py<PyList>,
    const_inputs: Vec<Py<PyAny>>,
    plan: Plan,
    /// For a pmap across processes: the local aval and sharding each output leaf becomes.
    out_local: Option<Vec<Option<Conversion>>>,
    /// The executable's input shardings (constants first) and output shardings (where the
    /// miss gave them), which `fastpjit.explain` reports.
    in_shardings: Vec<Py<PyAny>>,
    out_shardings: Vec<Py<PyAny>>,
}

impl Entry {
    /// The entry of an executable compiled for calls of `signature`, such as the call whose
    /// flat arguments are `leaves`.
    pub fn new(
        py: Python<'_>,
        h: &Handles,
        fast: &FastPath,
        signature: &CallSignature,
        leaves: &[Bound<'_, PyAny>],
    ) -> PyResult<Self> {
        let num_args = signature.leaves.len();
        if fast.donated.len() != num_args {
            return Err(refusal(DispatchError::MissArity {
                described: fast.donated.len(),
                call: num_args,
            }));
        }
        let num_consts = fast.const_args.len();
        let const_inputs = fast
            .const_args
            .iter()
            .zip(&fast.kept)
            .filter(|(_, &kept)| kept)
            .map(|(c, _)| c.clone_ref(py))
            .collect();
        let mut multi_device = false;
        for sharding in &fast.in_shardings {
            let devices: usize = sharding
                .bind(py)
                .getattr(names(py).num_devices.bind(py))?
                .extract()?;
            multi_device |= devices > 1;
        }
        let keys = &signature.leaves;
        let plan = Plan::new(
            fast.kept[..num_consts].iter().filter(|&&k| k).count(),
            &fast.kept[num_consts..],
            &fast.donated,
            |j| keys[j].is_array(),
            multi_device,
            |j, position| {
                let sharding = fast.in_shardings[position].clone_ref(py);
                if let Some((aval, global)) = fast.in_global.as_ref().and_then(|g| g[j].as_ref()) {
                    let local = (aval.clone_ref(py), global.clone_ref(py));
                    return Ok(match keys[j] {
                        LeafKey::Array { .. } => Input::Rewrap(local),
                        LeafKey::Host { .. } | LeafKey::Scalar(_) => Input::ProcessLocal(local),
                    });
                }
                match &keys[j] {
                    LeafKey::Array { sharding: own, .. } => {
                        array_input(h, &leaves[j], own.bind(py), sharding, fast.donated[j])
                    }
                    LeafKey::Host { .. } | LeafKey::Scalar(_) => Ok(Input::Host(HostArg {
                        host: HostInput::new(&leaves[j], sharding.bind(py))?,
                        kept: (!fast.donated[j]).then(Mutex::default),
                    })),
                }
            },
        )?;
        let out_treedef = fast.out_treedef.bind(py);
        let leaf_count: usize = out_treedef
            .getattr(names(py).num_leaves.bind(py))?
            .extract()?;
        let node_count: usize = out_treedef
            .getattr(names(py).num_nodes.bind(py))?
            .extract()?;
        let outputs = Outputs::choose(
            leaf_count,
            node_count,
            || Tree::of_builtin_treedef(out_treedef),
            || Ok(out_treedef.getattr(names(py).unflatten.bind(py))?.unbind()),
        )?;
        Ok(Self {
            execute_sharded: fast
                .executable
                .bind(py)
                .getattr(names(py).execute_sharded.bind(py))?
                .unbind(),
            outputs,
            out_handlers: fast.out_handlers.clone_ref(py),
            const_inputs,
            plan,
            out_local: fast.out_local.as_ref().map(|local| {
                local
                    .iter()
                    .map(|o| o.as_ref().map(|(a, s)| (a.clone_ref(py), s.clone_ref(py))))
                    .collect()
            }),
            in_shardings: fast.in_shardings.iter().map(|s| s.clone_ref(py)).collect(),
            out_shardings: fast.out_shardings.iter().map(|s| s.clone_ref(py)).collect(),
        })
    }

    /// What `fastpjit.explain` reports of this entry: how each flat argument becomes an input
    /// (the core's kinds: `pass`, `copy`, `move`, `host`, `dropped`, ...), and the
    /// executable's input and output shardings.
    pub fn report<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        let kinds: Vec<&str> = self.plan.inputs.iter().map(plan::Input::kind).collect();
        out.set_item("inputs", kinds)?;
        out.set_item("in_shardings", &self.in_shardings)?;
        out.set_item("out_shardings", &self.out_shardings)?;
        Ok(out)
    }

    /// Runs the executable on a call's leaves; says in `took` how the arguments became
    /// inputs.
    pub fn run<'py>(
        &self,
        py: Python<'py>,
        h: &Handles,
        call: &LiveCall<'_, 'py>,
        took: &mut Took,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (leaves, keys) = (call.leaves(), &call.keys[..]);
        let inputs = if self.plan.passthrough {
            self.check_arrays(h, leaves)?;
            call.leaf_tuple()?
        } else {
            if !self.plan.donated.is_empty() {
                self.check_donations(leaves)?;
            }
            let mut inputs: Vec<Bound<'py, PyAny>> =
                Vec::with_capacity(self.const_inputs.len() + leaves.len());
            // Whether the transfer guard watches host-to-device transfers: read for the first
            // host argument, once per call (it is per thread, and placing does not change it).
            let mut host_guarded = None;
            inputs.extend(self.const_inputs.iter().map(|c| c.bind(py).clone()));
            for (j, ((input, leaf), key)) in
                self.plan.inputs.iter().zip(leaves).zip(keys).enumerate()
            {
                match input {
                    Input::Dropped => {}
                    Input::Pass => {
                        if self.plan.multi_device {
                            check_live(h, leaf, j)?;
                        }
                        took.inputs.passed();
                        inputs.push(leaf.clone());
                    }
                    Input::Copy(copy) => {
                        // jaxlib's copy reads the array's buffers unchecked.
                        check_live(h, leaf, j)?;
                        let (input, how) = copy.copied(h, leaf)?;
                        took.inputs.copied(how);
                        inputs.push(input);
                    }
                    Input::Move(sharding) => {
                        check_live(h, leaf, j)?;
                        took.moved = true;
                        inputs.push(h.shard_arg.bind(py).call1((leaf, sharding))?);
                    }
                    Input::Host(host) => {
                        let guarded = match host_guarded {
                            Some(guarded) => guarded,
                            None => *host_guarded.insert(h.host_transfers_guarded(py)?),
                        };
                        let (input, streaming) = host.place(h, leaf, key, guarded)?;
                        let numpy_array = matches!(
                            key,
                            LiveLeaf::Host {
                                kind: HostKind::Array,
                                ..
                            }
                        );
                        took.inputs.placed_host(streaming, numpy_array);
                        inputs.push(input);
                    }
                    Input::Rewrap((aval, sharding)) => {
                        check_live(h, leaf, j)?;
                        inputs.push(h.rewrap.bind(py).call1((leaf, aval, sharding))?);
                    }
                    Input::ProcessLocal((aval, sharding)) => {
                        let shape = aval.bind(py).getattr(names(py).shape.bind(py))?;
                        let dtype = aval.bind(py).getattr(names(py).dtype.bind(py))?;
                        let local = h.arrays.asarray.bind(py).call1((leaf, dtype))?;
                        inputs.push(make_array_from_process_local_leaf(
                            &local,
                            sharding.bind(py),
                            Some(&shape),
                        )?);
                    }
                }
            }
            PyTuple::new(py, inputs)?
        };
        mark(&mut took.clock, Stage::Inputs);
        self.execute(h, &inputs, leaves, &mut took.clock, |j| {
            matches!(keys[j], LiveLeaf::Array { .. })
        })
    }

    /// The position among a call's leaves of each host value that this entry places, with the
    /// input sharding it is placed on.
    pub fn host_targets(&self, py: Python<'_>) -> Vec<(usize, Py<PyAny>)> {
        self.plan
            .inputs
            .iter()
            .enumerate()
            .filter_map(|(j, input)| match input {
                Input::Host(host) => Some((j, host.host.target().clone_ref(py))),
                _ => None,
            })
            .collect()
    }

    /// Whether a call's leaves are the executable's inputs as they are (see `run_arrays`).
    pub fn passes_through(&self) -> bool {
        self.plan.passthrough
    }

    /// Which of a call's leaves the executable takes as they are, where it takes each so or
    /// not at all (see `run_arrays`).
    pub fn taken_as_is(&self) -> Option<Vec<bool>> {
        self.plan.taken_as_is()
    }

    /// Whether the executable takes leaf `j` as it is.
    fn takes_as_is(&self, j: usize) -> bool {
        self.plan.passthrough || matches!(self.plan.inputs.get(j), Some(Input::Pass))
    }

    /// Whether JAX's C++ dispatch takes this entry's calls as they come: one device, and every
    /// argument an array on the input sharding or a host value.
    pub fn delegable(&self) -> bool {
        self.plan.delegable() && self.out_local.is_none()
    }

    /// Runs the executable of an entry that takes each leaf as it is or not at all
    /// (`taken_as_is`) on a call's `leaves`, every one that it takes an array that the call's
    /// signature has proven to be on its input sharding; `inputs` are those it takes, where
    /// it does not take them all.
    pub fn run_arrays<'py>(
        &self,
        h: &Handles,
        leaves: &Bound<'py, PyTuple>,
        inputs: Option<&Bound<'py, PyTuple>>,
        clock: &mut Option<Clock>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let all = leaves.as_slice();
        self.check_arrays(h, all)?;
        mark(clock, Stage::Inputs);
        self.execute(h, inputs.unwrap_or(leaves), all, clock, |j| {
            self.takes_as_is(j)
        })
    }

    /// Checks the arrays that an entry takes as they are. jaxlib crashes on a deleted or
    /// donated input that spans devices, so those are checked before; on one device it refuses
    /// them, and they are named after (see `execute`).
    fn check_arrays(&self, h: &Handles, leaves: &[Bound<'_, PyAny>]) -> PyResult<()> {
        if !self.plan.donated.is_empty() {
            self.check_donations(leaves)?;
        }
        if self.plan.multi_device {
            for (j, leaf) in leaves.iter().enumerate() {
                if self.takes_as_is(j) {
                    check_live(h, leaf, j)?;
                }
            }
        }
        Ok(())
    }

    /// Runs the executable on `inputs`, made from `leaves`, and builds the outputs. Where
    /// jaxlib refuses the inputs, the first deleted or donated array among the leaves (those
    /// for which `is_array` holds) is named instead.
    fn execute<'py>(
        &self,
        h: &Handles,
        inputs: &Bound<'py, PyTuple>,
        leaves: &[Bound<'py, PyAny>],
        clock: &mut Option<Clock>,
        is_array: impl Fn(usize) -> bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = inputs.py();
        let results = match self.execute_sharded.bind(py).call1((inputs,)) {
            Ok(results) => results,
            Err(err) => {
                for (j, leaf) in leaves.iter().enumerate() {
                    if is_array(j) {
                        check_live(h, leaf, j)?;
                    }
                }
                return Err(err);
            }
        };
        h.count_execution(py);
        mark(clock, Stage::Execute);
        let mut outs = h
            .consume_with_handlers
            .bind(py)
            .call1((results, self.out_handlers.bind(py)))?;
        if let Some(local) = &self.out_local {
            outs = Self::to_local(h, &outs, local)?;
        }
        let out = match &self.outputs {
            Outputs::Leaf => outs.get_item(0),
            Outputs::Builtin(tree) => tree.unflatten(outs.cast::<PyList>()?),
            Outputs::Unflatten(unflatten) => unflatten.bind(py).call1((outs,)),
        };
        mark(clock, Stage::Outputs);
        out
    }

    /// Raises JAX's error where a donated argument is also another argument of the call:
    /// jaxlib refuses that on one device and crashes on several. (Two array objects over one
    /// set of buffers, made with `jax.make_array_from_single_device_arrays` from another's
    /// shards, are not told apart: comparing buffers waits for the arrays to be computed,
    /// which a donation loop would pay on every call. JAX's own jit crashes on those too.)
    fn check_donations(&self, leaves: &[Bound<'_, PyAny>]) -> PyResult<()> {
        match self
            .plan
            .donation_clash(leaves.len(), |k, j| leaves[k].is(&leaves[j]))
        {
            Some(clash) => Err(refusal(DispatchError::DonationClash(clash))),
            None => Ok(()),
        }
    }

    /// The outputs of a pmap across processes as host-local arrays, where `local` says so.
    fn to_local<'py>(
        h: &Handles,
        outs: &Bound<'py, PyAny>,
        local: &[Option<Conversion>],
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = outs.py();
        let mut converted = Vec::with_capacity(local.len());
        for (out, local) in outs.try_iter()?.zip(local) {
            let out = out?;
            converted.push(match local {
                Some((aval, sharding)) => h.rewrap.bind(py).call1((&out, aval, sharding))?,
                None => out,
            });
        }
        Ok(PyList::new(py, converted)?.into_any())
    }

    /// Visits the objects that may lead back to the caller's: constants and the output tree.
    pub fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        for constant in &self.const_inputs {
            visit.call(constant)?;
        }
        for sharding in self.in_shardings.iter().chain(&self.out_shardings) {
            visit.call(sharding)?;
        }
        match &self.outputs {
            Outputs::Leaf => Ok(()),
            Outputs::Builtin(tree) => tree.traverse(visit),
            Outputs::Unflatten(unflatten) => visit.call(unflatten),
        }
    }
}

/// Raises JAX's error for an array that was deleted or donated: jaxlib crashes on one.
fn check_live(h: &Handles, array: &Bound<'_, PyAny>, position: usize) -> PyResult<()> {
    let py = array.py();
    if !is_deleted(h, array)? {
        return Ok(());
    }
    if !h.array_was_donated.bind(py).call1((array,))?.is_truthy()? {
        return Err(deleted_error(array)?);
    }
    let shape = array
        .getattr(names(py).aval.bind(py))?
        .call_method0(names(py).str_short.bind(py))?;
    Err(refusal(DispatchError::DonatedArgument {
        position,
        shape: shape.to_string(),
    }))
}

impl CopyInput {
    /// `array`, a live array, on the executable's device: the copy kept of it if there is one
    /// (and the transfer guard does not watch device-to-device transfers), else copied now.
    /// Also says how: taken from the kept copy, copied as a new array, or copied to be kept.
    fn copied<'py>(
        &self,
        h: &Handles,
        array: &Bound<'py, PyAny>,
    ) -> PyResult<(Bound<'py, PyAny>, Copied)> {
        let py = array.py();
        let Some(latest) = &self.latest else {
            return Ok((self.copy(h, array)?, Copied::New));
        };
        let lock = || latest.lock().unwrap_or_else(PoisonError::into_inner);
        let address = array.as_ptr() as usize;
        // The call holds `array`, a jax.Array: alive and not None.
        let (kept, seen_again) = {
            let latest = lock();
            let (kept, seen_again) = latest.lookup(address, |source| refers_to(source, array));
            (kept.map(|copy| copy.clone_ref(py)), seen_again)
        };
        if let Some(copy) = kept {
            let copy = copy.into_bound(py);
            // `jax.live_arrays()` can reach the copy and delete it; then it is copied anew.
            if !h.transfers_guarded(names(py).device_to_device.bind(py))? && !is_deleted(h, &copy)?
            {
                return Ok((copy, Copied::Kept));
            }
        }
        let copy = self.copy(h, array)?;
        let now = LatestCopy::after_copy(address, seen_again, || {
            Ok::<_, PyErr>((
                PyWeakrefReference::new(array)?.unbind(),
                copy.clone().unbind(),
            ))
        })?;
        // The copy no longer kept is released after the lock: freeing a jax.Array releases
        // the GIL, and a thread that takes it may be waiting for this lock.
        let released = std::mem::replace(&mut *lock(), now);
        drop(released);
        Ok((copy, Copied::now(seen_again)))
    }

    fn copy<'py>(&self, h: &Handles, array: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let py = array.py();
        let (devices, shardings, semantics) = &self.targets;
        h.batched_copy
            .bind(py)
            .call1((PyList::new(py, [array])?, devices, shardings, semantics))?
            .get_item(0)
    }
}

impl HostArg {
    /// The host value `leaf` on the input's sharding: a kept device copy of the same bytes if
    /// there is one, else placed now, and kept if the value was seen among the latest. Where
    /// the transfer guard watches host-to-device transfers (`guarded`), it is placed as JAX
    /// places it, so that the guard sees the transfer as JAX's.
    /// Also says whether it was placed now as one of a stream of new values (see
    /// `KeptValues::streaming`; always, for a value too large to keep copies of).
    fn place<'py>(
        &self,
        h: &Handles,
        leaf: &Bound<'py, PyAny>,
        key: &LiveLeaf<'py>,
        guarded: bool,
    ) -> PyResult<(Bound<'py, PyAny>, bool)> {
        let py = leaf.py();
        if guarded {
            return Ok((self.host.place_guarded(leaf)?, true));
        }
        let kept_and_bytes = self
            .kept
            .as_ref()
            .and_then(|kept| Some((kept, ValueBytes::of(leaf, key)?)));
        let Some((kept, bytes)) = kept_and_bytes else {
            return Ok((self.host.place(leaf)?, true));
        };
        let bytes = bytes.as_slice();
        let lock = || kept.lock().unwrap_or_else(PoisonError::into_inner);
        let copy = lock().get(bytes).map(|copy| copy.clone_ref(py));
        let (admitted, streaming) = if let Some(copy) = copy {
            let copy = copy.into_bound(py);
            // `jax.live_arrays()` can reach it and delete it; then it is placed anew.
            if !is_deleted(h, &copy)? {
                return Ok((copy, false));
            }
            (true, false)
        } else {
            let mut kept = lock();
            (kept.admit(bytes), kept.streaming())
        };
        if !admitted {
            return Ok((self.host.place(leaf)?, streaming));
        }
        // The copy kept is placed from a snapshot of a numpy array, and keyed by the
        // snapshot's bytes: on the CPU jaxlib adopts aligned numpy memory, and the caller may
        // change its array later, or while this call has released the GIL.
        let snapshot = match key {
            LiveLeaf::Host { descr: None, .. } => private_copy(leaf)?,
            _ => leaf.clone(),
        };
        let array = self.host.place(&snapshot)?;
        if let Some(bytes) = ValueBytes::of(&snapshot, key) {
            // The copies no longer kept are released after the lock: freeing a jax.Array
            // releases the GIL, and a thread that takes it may be waiting for this lock.
            let dropped = lock().keep(bytes.as_slice(), array.clone().unbind());
            drop(dropped);
        }
        Ok((array, false))
    }
}

/// A C-ordered copy of a numpy array, in memory of its own.
fn private_copy<'py>(leaf: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let py = leaf.py();
    let array = leaf.cast::<PyUntypedArray>()?;
    // SAFETY: copies a live numpy array; a null result carries numpy's error.
    unsafe {
        let copy = PY_ARRAY_API.PyArray_NewCopy(py, array.as_array_ptr(), NPY_ORDER::NPY_CORDER);
        Bound::from_owned_ptr_or_err(py, copy)
    }
}

/// The bytes of a host leaf's value, which key its device copies: a scalar's bits (so 0.0
/// and -0.0 differ, and a NaN equals itself), or a small C-ordered numpy array's memory. None
/// for other values, and for a Python int beyond 64 bits (which JAX rejects when placed).
enum ValueBytes<'a> {
    Scalar([u8; 16]),
    Array(&'a [u8]),
}

impl<'a> ValueBytes<'a> {
    fn of(leaf: &'a Bound<'_, PyAny>, key: &LiveLeaf<'_>) -> Option<Self> {
        let bits = |low: u64, high: u64| {
            let mut bytes = [0u8; 16];
            bytes[..8].copy_from_slice(&low.to_le_bytes());
            bytes[8..].copy_from_slice(&high.to_le_bytes());
            Some(Self::Scalar(bytes))
        };
        match key {
            LiveLeaf::Scalar(ScalarKind::Bool) => {
                bits(u64::from(leaf.cast::<PyBool>().ok()?.is_true()), 0)
            }
            LiveLeaf::Scalar(ScalarKind::Int) => {
                bits(leaf.cast::<PyInt>().ok()?.extract::<i64>().ok()? as u64, 0)
            }
            LiveLeaf::Scalar(ScalarKind::Float) => {
                bits(leaf.cast::<PyFloat>().ok()?.value().to_bits(), 0)
            }
            LiveLeaf::Scalar(ScalarKind::Complex) => {
                let value = leaf.cast::<PyComplex>().ok()?;
                bits(value.real().to_bits(), value.imag().to_bits())
            }
            LiveLeaf::Host {
                descr: Some(descr), ..
            } => {
                if descr.itemsize() > 16 {
                    return None;
                }
                let mut bytes = [0u8; 16];
                // SAFETY: `leaf` is a numpy scalar of dtype `descr`, whose value fits the buffer.
                unsafe {
                    PY_ARRAY_API.PyArray_ScalarAsCtype(
                        leaf.py(),
                        leaf.as_ptr(),
                        bytes.as_mut_ptr().cast(),
                    );
                }
                Some(Self::Scalar(bytes))
            }
            LiveLeaf::Host { descr: None, .. } => {
                let array = leaf.cast::<PyUntypedArray>().ok()?;
                let len = array.len() * array.dtype().itemsize();
                if !array.is_c_contiguous() || len > KEPT_ARRAY_BYTES {
                    return None;
                }
                // SAFETY: a C-contiguous array's `len` bytes start at its data pointer, and
                // `leaf` keeps them alive for 'a. Another thread that writes them without the
                // GIL races with this read as it would with the copy that placing makes.
                let data = unsafe { (*array.as_array_ptr()).fields.data };
                Some(Self::Array(if len == 0 {
                    &[]
                } else {
                    // SAFETY: as above; `len` is not zero, so `data` is not dangling.
                    unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) }
                }))
            }
            LiveLeaf::Array { .. } => None,
        }
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            Self::Scalar(bytes) => bytes,
            Self::Array(bytes) => bytes,
        }
    }
}

fn is_deleted(h: &Handles, array: &Bound<'_, PyAny>) -> PyResult<bool> {
    h.arrays
        .array_is_deleted
        .bind(array.py())
        .call1((array,))?
        .is_truthy()
}

#[cfg(test)]
mod tests {
    use std::ffi::CStr;

    use pyo3::exceptions::{PyRuntimeError, PyValueError};
    use pyo3::types::PyModule;

    use super::*;
    use crate::handles::handles;
    use crate::testing::{helper_module, items as list};

    /// Values to read, and what JAX and numpy say of them (the oracles).
    const HELPERS: &CStr = cr#"
import struct

import jax
import jax.numpy as jnp
import numpy as np


def scalar_bytes(value):
    """A Python scalar's bits, little-endian, in 16 bytes."""
    if isinstance(value, complex):
        return struct.pack("<dd", value.real, value.imag)
    if isinstance(value, float):
        return struct.pack("<d", value) + bytes(8)
    return struct.pack("<q", value) + bytes(8)


def python_scalars():
    nan = float("nan")
    return [True, False, 0, 7, -1, 2**63 - 1, -(2**63), 0.0, -0.0, nan, float("inf"), 1.5,
            complex(1, -2), complex(-0.0, 0.0)]


def wide_ints():
    """Ints beyond 64 bits, which JAX rejects when placed."""
    return [2**63, -(2**63) - 1, 2**100]


def numpy_scalars():
    return [np.float32(1.5), np.float64(-0.0), np.float16(2), np.int8(-3), np.uint64(2**64 - 1),
            np.bool_(True), np.complex64(1 - 2j), np.complex128(3 + 4j), np.int32(5)]


def numpy_scalar_bytes(value):
    return value.tobytes().ljust(16, b"\0")


def keyed_arrays():
    """C-ordered numpy arrays of at most 1 KiB."""
    return [np.arange(6, dtype=np.int32).reshape(2, 3), np.zeros(0), np.array(3.0),
            np.ones(128), np.arange(4, dtype=np.float16)[1:]]


def unkeyed_arrays():
    """Numpy arrays not C-ordered, or over 1 KiB."""
    base = np.arange(6.0).reshape(2, 3)
    return [base[:, ::2], np.asfortranarray(base), base.T, np.ones(129)]


def cached_call_error(array):
    """The error that JAX's cached call raises for `array`."""
    f = jax.jit(lambda a: a * 2)
    f(jnp.zeros(array.shape, array.dtype))
    try:
        f(array)
    except Exception as err:
        return err
    raise AssertionError("JAX took the array")


def donated():
    """An array that a computation consumed."""
    array = jnp.ones(3)
    jax.jit(lambda a: a + 1, donate_argnums=0)(array)
    return array


def private_copy_cases():
    base = np.arange(12.0).reshape(3, 4)
    return [base, np.asfortranarray(base), base[:, ::2], base.T, np.array(5, dtype=np.int8)]


def check_private_copy(original, copy):
    """The copy is equal, C-ordered, of memory of its own: writing the original leaves it."""
    assert type(copy) is np.ndarray and copy.dtype == original.dtype, (original, copy)
    assert np.array_equal(copy, original) and copy.flags.c_contiguous and copy.flags.owndata
    assert not np.shares_memory(copy, original)
    before = copy.copy()
    original[...] = 42
    assert np.array_equal(copy, before)


def aligned_arange(n):
    """`np.arange(n, dtype=np.float32)` at a 64-byte aligned address, which jaxlib adopts on
    the CPU instead of copying it."""
    buffer = np.zeros(4 * n + 64, np.uint8)
    start = -buffer.ctypes.data % 64
    array = buffer[start : start + 4 * n].view(np.float32)
    array[...] = np.arange(n)
    return array


def device_ids(array):
    return sorted(d.id for d in array.devices())


def equal(a, b):
    return bool(np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True))
"#;

    fn helpers(py: Python<'_>) -> Bound<'_, PyModule> {
        helper_module(py, c"fastpjit_entry_helpers", HELPERS)
    }

    fn call<'py>(
        m: &Bound<'py, PyModule>,
        name: &str,
        args: impl pyo3::call::PyCallArgs<'py>,
    ) -> Bound<'py, PyAny> {
        m.call_method1(name, args).unwrap()
    }

    /// The bytes that key the device copies of `leaf`, a leaf the dispatcher keys.
    fn value_bytes(h: &Handles, leaf: &Bound<'_, PyAny>) -> Option<Vec<u8>> {
        let key = LiveLeaf::read(h, leaf).unwrap().expect("a keyed leaf");
        ValueBytes::of(leaf, &key).map(|bytes| bytes.as_slice().to_vec())
    }

    #[test]
    fn a_host_values_bytes_are_its_value_bits_or_its_memory() {
        Python::initialize();
        Python::attach(|py| {
            let h = handles(py).unwrap();
            let m = helpers(py);
            for (cases, oracle) in [
                ("python_scalars", "scalar_bytes"),
                ("numpy_scalars", "numpy_scalar_bytes"),
            ] {
                for value in list(&m, cases) {
                    let expected: Vec<u8> = call(&m, oracle, (&value,)).extract().unwrap();
                    assert_eq!(value_bytes(h, &value), Some(expected), "{value:?}");
                }
            }
            // 0.0 and -0.0 have other bytes; two NaN objects the same.
            let float = |v: f64| v.into_pyobject(py).unwrap().into_any();
            assert_ne!(value_bytes(h, &float(0.0)), value_bytes(h, &float(-0.0)));
            assert_eq!(
                value_bytes(h, &float(f64::NAN)),
                value_bytes(h, &float(f64::NAN))
            );
            for value in list(&m, "wide_ints") {
                assert_eq!(value_bytes(h, &value), None, "{value:?}");
            }
            for array in list(&m, "keyed_arrays") {
                let expected: Vec<u8> = array.call_method0("tobytes").unwrap().extract().unwrap();
                assert_eq!(value_bytes(h, &array), Some(expected), "{array:?}");
            }
            for array in list(&m, "unkeyed_arrays") {
                assert_eq!(value_bytes(h, &array), None, "{array:?}");
            }
            let jax_array = py
                .import("jax.numpy")
                .unwrap()
                .call_method1("ones", (3,))
                .unwrap();
            assert_eq!(value_bytes(h, &jax_array), None);
        });
    }

    #[test]
    fn check_live_raises_jaxs_errors_for_deleted_and_donated_arrays() {
        Python::initialize();
        Python::attach(|py| {
            let h = handles(py).unwrap();
            let m = helpers(py);
            let array = py
                .import("jax.numpy")
                .unwrap()
                .call_method1("ones", (3,))
                .unwrap();
            assert!(!is_deleted(h, &array).unwrap());
            check_live(h, &array, 0).unwrap();
            array.call_method0("delete").unwrap();
            assert!(is_deleted(h, &array).unwrap());
            // Deleted: JAX's error, type and message.
            let ours = check_live(h, &array, 0).unwrap_err();
            let theirs = call(&m, "cached_call_error", (&array,));
            assert!(ours.is_instance_of::<PyRuntimeError>(py), "{ours}");
            assert!(ours.get_type(py).is(theirs.get_type()));
            assert_eq!(ours.value(py).to_string(), theirs.to_string());
            // Donated: the error of JAX's cached call. On jax 0.10.2 that is a ValueError of
            // its own, which fastpjit's names the argument with; from 0.11.2 it is the deleted
            // array's RuntimeError.
            let donated = m.call_method0("donated").unwrap();
            assert!(is_deleted(h, &donated).unwrap());
            let ours = check_live(h, &donated, 2).unwrap_err();
            let theirs = call(&m, "cached_call_error", (&donated,));
            assert!(ours.get_type(py).is(theirs.get_type()), "{ours}");
            let message = ours.value(py).to_string();
            if ours.is_instance_of::<PyValueError>(py) {
                assert!(
                    message.contains("argument 2") && message.contains("shape=float32[3]"),
                    "{message}"
                );
            } else {
                assert_eq!(message, theirs.to_string());
            }
        });
    }

    #[test]
    fn a_private_copy_is_c_ordered_in_memory_of_its_own() {
        Python::initialize();
        Python::attach(|py| {
            let m = helpers(py);
            for array in list(&m, "private_copy_cases") {
                let copy = private_copy(&array).unwrap();
                call(&m, "check_private_copy", (&array, &copy));
            }
            let not_an_array = PyList::new(py, [1, 2]).unwrap();
            assert!(private_copy(not_an_array.as_any()).is_err());
        });
    }

    /// `array` on the device of `copy`'s target (device 1), as `copy` copies it, and how.
    fn copied<'py>(
        h: &Handles,
        m: &Bound<'py, PyModule>,
        copy: &CopyInput,
        array: &Bound<'py, PyAny>,
    ) -> (Bound<'py, PyAny>, Copied) {
        let (out, how) = copy.copied(h, array).unwrap();
        let ids: Vec<usize> = call(m, "device_ids", (&out,)).extract().unwrap();
        assert_eq!(ids, [1]);
        assert!(call(m, "equal", (&out, array)).is_truthy().unwrap());
        assert!(!is_deleted(h, &out).unwrap());
        (out, how)
    }

    /// `leaf` placed as `arg` places it, with its value.
    fn placed<'py>(
        h: &Handles,
        m: &Bound<'py, PyModule>,
        arg: &HostArg,
        leaf: &Bound<'py, PyAny>,
        guarded: bool,
    ) -> Bound<'py, PyAny> {
        let key = LiveLeaf::read(h, leaf).unwrap().unwrap();
        let (out, _) = arg.place(h, leaf, &key, guarded).unwrap();
        assert!(call(m, "equal", (&out, leaf)).is_truthy().unwrap());
        out
    }

    #[test]
    fn an_array_on_another_device_is_copied_and_its_latest_copy_used_again() {
        Python::initialize();
        Python::attach(|py| {
            let h = handles(py).unwrap();
            let m = helpers(py);
            let jax = py.import("jax").unwrap();
            let sharding = py.import("jax.sharding").unwrap();
            let devices = jax.call_method0("devices").unwrap();
            let on = |device: usize| {
                sharding
                    .call_method1("SingleDeviceSharding", (devices.get_item(device).unwrap(),))
                    .unwrap()
            };
            let array_on_0 = |start: f64| {
                let values = py
                    .import("jax.numpy")
                    .unwrap()
                    .call_method1("arange", (start, start + 4.0))
                    .unwrap();
                jax.call_method1("device_put", (values, devices.get_item(0).unwrap()))
                    .unwrap()
            };
            let x = array_on_0(0.0);
            let own = h.arrays.array_sharding.bind(py).call1((&x,)).unwrap();
            let input = |target: Bound<'_, PyAny>, donated: bool| {
                array_input(h, &x, &own, target.unbind(), donated).unwrap()
            };
            // On its own device it passes; on a mesh of two it is moved.
            assert!(matches!(input(on(0), false), Input::Pass));
            let mesh = jax.call_method1("make_mesh", ((2,), ("a",))).unwrap();
            let spec = sharding.call_method0("PartitionSpec").unwrap();
            let two = sharding
                .call_method1("NamedSharding", (mesh, spec))
                .unwrap();
            assert!(matches!(input(two, false), Input::Move(_)));
            // On another device it is copied, and its copy kept unless donated.
            let Input::Copy(copy) = input(on(1), false) else {
                panic!("a copy");
            };
            assert!(copy.latest.is_some());
            let Input::Copy(consumed) = input(on(1), true) else {
                panic!("a copy");
            };
            assert!(consumed.latest.is_none());

            let copied = |copy: &CopyInput, array| copied(h, &m, copy, array);
            // The copy is kept from the second call in a row with the array, and used again.
            let (first, how) = copied(&copy, &x);
            assert_eq!(how, Copied::New);
            let (second, how) = copied(&copy, &x);
            assert!(!second.is(&first) && how == Copied::ToKeep);
            let (again, how) = copied(&copy, &x);
            assert!(again.is(&second) && how == Copied::Kept);
            assert!(copied(&copy, &x).0.is(&second));
            // Another array is copied, and the copy kept of the first is let go.
            let y = array_on_0(10.0);
            let (of_y, how) = copied(&copy, &y);
            assert!(!of_y.is(&second) && how == Copied::New);
            let (of_x, how) = copied(&copy, &x);
            assert!(!of_x.is(&second) && how == Copied::New);
            // A kept copy that was deleted is copied anew.
            let kept = copied(&copy, &x).0;
            assert!(copied(&copy, &x).0.is(&kept));
            kept.call_method0("delete").unwrap();
            let fresh = copied(&copy, &x).0;
            assert!(!fresh.is(&kept));
            // (That copy is not kept: the rule starts over, and keeps the next one.)
            let again = copied(&copy, &x).0;
            assert!(copied(&copy, &x).0.is(&again));
            // A donated argument's copy is never kept.
            let (once, how) = copied(&consumed, &x);
            assert_eq!(how, Copied::New);
            for _ in 0..3 {
                assert!(!copied(&consumed, &x).0.is(&once));
            }
        });
    }

    #[test]
    fn a_host_value_is_placed_from_its_kept_copy_only_while_its_bytes_are_the_same() {
        Python::initialize();
        Python::attach(|py| {
            let h = handles(py).unwrap();
            let m = helpers(py);
            let np = py.import("numpy").unwrap();
            let jax = py.import("jax").unwrap();
            let device = jax.call_method0("devices").unwrap().get_item(0).unwrap();
            let target = py
                .import("jax.sharding")
                .unwrap()
                .call_method1("SingleDeviceSharding", (device,))
                .unwrap();
            // Memory that jaxlib would adopt: a copy kept must be placed from a snapshot.
            let x = call(&m, "aligned_arange", (4,));
            let arg = |kept: bool| HostArg {
                host: HostInput::new(&x, &target).unwrap(),
                kept: kept.then(Mutex::default),
            };
            let place = |arg: &HostArg, leaf, guarded| placed(h, &m, arg, leaf, guarded);
            let host = arg(true);
            // Kept from the second placing of the same bytes, and used again.
            let first = place(&host, &x, false);
            let second = place(&host, &x, false);
            assert!(!second.is(&first));
            assert!(place(&host, &x, false).is(&second));
            // An equal array, another object, has the same bytes.
            let equal = x.call_method0("copy").unwrap();
            assert!(place(&host, &equal, false).is(&second));
            // The caller writes its array: its new bytes are placed, and the copy kept holds
            // the bytes it was kept for (it was placed from a snapshot).
            let before = x.call_method0("copy").unwrap();
            x.set_item(0, 100).unwrap();
            assert!(!place(&host, &x, false).is(&second));
            assert!(call(&m, "equal", (&second, &before)).is_truthy().unwrap());
            x.set_item(0, 0).unwrap();
            assert!(place(&host, &x, false).is(&second));
            // A kept copy that was deleted is placed anew.
            second.call_method0("delete").unwrap();
            let fresh = place(&host, &x, false);
            assert!(!fresh.is(&second));
            assert!(place(&host, &x, false).is(&fresh));
            // Under the transfer guard, and for a donated argument, every placing is new.
            assert!(!place(&host, &x, true).is(&fresh));
            let consumed = arg(false);
            let once = place(&consumed, &x, false);
            for _ in 0..3 {
                assert!(!place(&consumed, &x, false).is(&once));
            }
            // Python scalars are kept by their bits: 0.0 and -0.0 apart.
            let zero = 0.0f64.into_pyobject(py).unwrap().into_any();
            let scalar = HostArg {
                host: HostInput::new(&zero, &target).unwrap(),
                kept: Some(Mutex::default()),
            };
            place(&scalar, &zero, false);
            let kept = place(&scalar, &zero, false);
            assert!(place(&scalar, &zero, false).is(&kept));
            let negative = (-0.0f64).into_pyobject(py).unwrap().into_any();
            let out = place(&scalar, &negative, false);
            assert!(!out.is(&kept));
            let signbit = np.call_method1("signbit", (&out,)).unwrap();
            assert!(signbit.is_truthy().unwrap());
        });
    }
}
