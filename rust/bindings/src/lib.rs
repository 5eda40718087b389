//! `fastpjit._core`: the `PyO3` layer over `fastpjit_core`. It converts types and nothing more.

mod dispatch;
mod errors;
mod handles;
mod host_memory;
mod index_maps;
mod memo;
mod module_text;
mod process_local;
mod shard_buffer;
mod sharding;
mod stats;
#[cfg(test)]
mod testing;
mod transfer;

// Shared classes here rely on the GIL (the dispatcher never holds a lock across a call into
// Python, but it is not tested on a free-threaded interpreter), so the module does not declare
// free-threading support.
#[pyo3::pymodule(gil_used = true)]
mod _core {
    use pyo3::prelude::*;

    // Counters: `fastpjit.stats()`.
    #[pymodule_export]
    use crate::stats::{
        count_compiles, count_recompile_stopped, fallback_reasons, in_guarded_jax_call,
        py_count_fallback, recompile_guard, reset_stats, set_timing, stats,
    };

    // Sharding index maps and HLO sharding text.
    #[pymodule_export]
    use crate::index_maps::{
        addressable_devices_indices_map, canonical_hlo_sharding, device_placement_map,
        device_replica_id_map, devices_indices_map, indices_array, shard_shape,
    };

    // Transfers: device_put, device_get, process-local data, the host pool.
    #[pymodule_export]
    use crate::transfer::{
        device_get_leaf, device_put_leaf, transfer_cache_sizes, transfers_guarded,
    };

    #[pymodule_export]
    use crate::process_local::make_array_from_process_local_leaf;

    #[pymodule_export]
    use crate::host_memory::set_host_pool_limit;

    // compile_hlo's check of module text.
    #[pymodule_export]
    use crate::module_text::check_module_text;

    // The dispatcher.
    #[pymodule_export]
    use crate::dispatch::{
        clear_dispatch_memo, dispatch_memo_sizes, BoundFunction, CacheMiss, DispatchCache,
        FastPath, JitFunction,
    };

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add("__version__", env!("CARGO_PKG_VERSION"))
    }
}
