//! A cached executable and everything a cache hit needs to run it without Python of ours.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use super::fast::FastLeaf;
use super::handles::Handles;
use super::signature::{LeafKind, LeafSignature};
use crate::stats::count_fallback;
use crate::transfer::put_host_value;

pub struct Entry {
    /// The executable's bound `execute_sharded`.
    execute_sharded: Py<PyAny>,
    out_treedef: Py<PyAny>,
    /// Whether the output tree is one bare leaf, which needs no unflattening.
    single_output: bool,
    /// The sharding of each executable input, in executable order.
    in_shardings: Vec<Py<PyAny>>,
    out_handlers: Py<PyList>,
    /// Whether each of `[const args..., flat args...]` is an executable input.
    kept: Vec<bool>,
    /// The position among the executable's inputs of each flat argument it takes.
    positions: Vec<Option<usize>>,
    const_args: Vec<Py<PyAny>>,
}

impl Entry {
    /// Reads the tuple that `fastpjit._jax.jit_cache_miss` returns.
    pub fn from_miss(entry: &Bound<'_, PyAny>) -> PyResult<Self> {
        let part = |i: usize| entry.get_item(i);
        let objects = |i: usize| -> PyResult<Vec<Py<PyAny>>> {
            part(i)?.try_iter()?.map(|o| o.map(Bound::unbind)).collect()
        };
        let (executable, out_treedef) = (part(0)?, part(1)?);
        let (in_shardings, out_handlers) = (objects(2)?, part(3)?.cast_into::<PyList>()?);
        let (kept, const_args): (Vec<bool>, _) = (part(4)?.extract()?, objects(5)?);
        let py = entry.py();
        let leaf_count: usize = out_treedef.getattr(intern!(py, "num_leaves"))?.extract()?;
        let node_count: usize = out_treedef.getattr(intern!(py, "num_nodes"))?.extract()?;
        let mut taken = kept[..const_args.len().min(kept.len())]
            .iter()
            .filter(|&&k| k)
            .count();
        let positions = kept
            .iter()
            .skip(const_args.len())
            .map(|&k| {
                k.then(|| {
                    taken += 1;
                    taken - 1
                })
            })
            .collect();
        Ok(Self {
            execute_sharded: executable.getattr(intern!(py, "execute_sharded"))?.unbind(),
            single_output: leaf_count == 1 && node_count == 1,
            out_treedef: out_treedef.unbind(),
            in_shardings,
            out_handlers: out_handlers.unbind(),
            kept,
            positions,
            const_args,
        })
    }

    /// Runs the executable on `leaves` (keyed by `signature`) and builds the output tree.
    pub fn call<'py>(
        &self,
        py: Python<'py>,
        h: &Handles,
        leaves: &[Bound<'py, PyAny>],
        signature: &[LeafSignature],
        kind: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let inputs = self.inputs(py, leaves.iter().zip(signature), |(leaf, key), sharding| {
            prepare_input(py, h, leaf, key, sharding, kind)
        })?;
        self.run(py, h, inputs.as_any())
    }

    /// Takes, for each argument whose sharding (in `signature`) equals the executable's input
    /// sharding, the argument's sharding object in its place, so that later calls with arrays
    /// of that sharding (JAX shares sharding objects among arrays) match it by identity.
    pub fn adopt_equal_shardings(
        &mut self,
        py: Python<'_>,
        signature: &[LeafSignature],
    ) -> PyResult<()> {
        for (j, key) in signature.iter().enumerate() {
            let LeafKind::Array { sharding, .. } = &key.kind else {
                continue;
            };
            let Some(position) = self.input_position(j) else {
                continue;
            };
            let own = &mut self.in_shardings[position];
            if !own.is(&sharding.obj) && own.bind(py).eq(sharding.obj.bind(py))? {
                *own = sharding.obj.clone_ref(py);
            }
        }
        Ok(())
    }

    /// The position among the executable's inputs of flat argument `j`, if it takes it.
    fn input_position(&self, j: usize) -> Option<usize> {
        self.positions.get(j).copied().flatten()
    }

    /// The executable's input sharding for flat argument `j`, if it takes that argument.
    pub fn in_sharding_of_arg(&self, py: Python<'_>, j: usize) -> Option<Py<PyAny>> {
        let position = self.input_position(j)?;
        self.in_shardings.get(position).map(|s| s.clone_ref(py))
    }

    /// Whether the executable takes the call's flat arguments as they are: no constants, none
    /// dropped.
    pub fn takes_args_as_given(&self) -> bool {
        self.const_args.is_empty() && self.kept.iter().all(|&k| k)
    }

    /// Runs a call whose `leaves` passed a fast key with leaves `keys`; `passthrough` says
    /// that every leaf is an array the executable takes as it is.
    pub fn call_fast<'py>(
        &self,
        py: Python<'py>,
        h: &Handles,
        leaves: &Bound<'py, PyTuple>,
        keys: &[FastLeaf],
        passthrough: bool,
        kind: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        // jaxlib can crash on a deleted or donated input, so every input is checked first.
        if passthrough {
            for leaf in leaves.iter_borrowed() {
                h.check_not_deleted(&leaf)?;
            }
            return self.run(py, h, leaves.as_any());
        }
        let inputs = self.inputs(py, leaves.iter().zip(keys), |(leaf, key), sharding| {
            Ok(match key {
                FastLeaf::Array { direct: true, .. } => {
                    h.check_not_deleted(&leaf)?;
                    leaf
                }
                FastLeaf::Array { direct: false, .. } => {
                    h.check_not_deleted(&leaf)?;
                    count_moved(kind);
                    h.shard_arg.bind(py).call1((leaf, sharding))?
                }
                FastLeaf::Numpy { .. } => put_host_value(&leaf, sharding, false)?,
            })
        })?;
        self.run(py, h, inputs.as_any())
    }

    /// The executable's inputs: the kept constants, then each kept argument as `prepare`
    /// makes it for its input sharding.
    fn inputs<'py, A>(
        &self,
        py: Python<'py>,
        args: impl Iterator<Item = A>,
        mut prepare: impl FnMut(A, &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let num_consts = self.const_args.len();
        let mut inputs: Vec<Bound<'py, PyAny>> = Vec::with_capacity(self.in_shardings.len());
        for (i, c) in self.const_args.iter().enumerate() {
            if self.kept[i] {
                inputs.push(c.bind(py).clone());
            }
        }
        for (j, arg) in args.enumerate() {
            if self.kept[num_consts + j] {
                let sharding = self.in_shardings[inputs.len()].bind(py);
                inputs.push(prepare(arg, sharding)?);
            }
        }
        PyTuple::new(py, inputs)
    }

    fn run<'py>(
        &self,
        py: Python<'py>,
        h: &Handles,
        inputs: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let results = self.execute_sharded.bind(py).call1((inputs,))?;
        h.count_execution(py);
        let outs = h
            .consume_with_handlers
            .bind(py)
            .call1((results, self.out_handlers.bind(py)))?;
        if self.single_output {
            return outs.get_item(0);
        }
        self.out_treedef
            .bind(py)
            .call_method1(intern!(py, "unflatten"), (outs,))
    }
}

fn count_moved(kind: &str) {
    count_fallback(&format!(
        "{kind}: an argument moved to the executable's sharding by JAX"
    ));
}

/// One argument as the executable takes it: an array on `sharding`.
fn prepare_input<'py>(
    py: Python<'py>,
    h: &Handles,
    leaf: &Bound<'py, PyAny>,
    key: &LeafSignature,
    sharding: &Bound<'py, PyAny>,
    kind: &str,
) -> PyResult<Bound<'py, PyAny>> {
    match &key.kind {
        LeafKind::Array { sharding: own, .. } => {
            h.check_not_deleted(leaf)?;
            if own.obj.is(sharding) || own.obj.bind(py).eq(sharding)? {
                Ok(leaf.clone())
            } else {
                count_moved(kind);
                h.shard_arg.bind(py).call1((leaf, sharding))
            }
        }
        LeafKind::Numpy | LeafKind::Scalar => put_host_value(leaf, sharding, false),
    }
}
