//! `fastpjit._core`: the `PyO3` layer over `fastpjit_core`. It converts types and nothing more.

mod cache;
mod dispatch;
mod errors;
mod handles;
mod host_memory;
mod index_maps;
mod module_text;
mod process_local;
mod shard_buffer;
mod sharding;
mod stats;
mod transfer;

use pyo3::prelude::*;

// Shared classes here rely on the GIL (the dispatcher never holds a lock across a call into
// Python, but it is not tested on a free-threaded interpreter), so the module does not declare
// free-threading support.
#[pymodule(gil_used = true)]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(stats::stats, m)?)?;
    m.add_function(wrap_pyfunction!(stats::reset_stats, m)?)?;
    m.add_function(wrap_pyfunction!(stats::py_count_fallback, m)?)?;
    m.add_function(wrap_pyfunction!(stats::count_compiles, m)?)?;
    m.add_function(wrap_pyfunction!(stats::count_recompile_stopped, m)?)?;
    m.add_function(wrap_pyfunction!(index_maps::devices_indices_map, m)?)?;
    m.add_function(wrap_pyfunction!(
        index_maps::addressable_devices_indices_map,
        m
    )?)?;
    m.add_function(wrap_pyfunction!(index_maps::shard_shape, m)?)?;
    m.add_function(wrap_pyfunction!(index_maps::device_replica_id_map, m)?)?;
    m.add_function(wrap_pyfunction!(index_maps::indices_array, m)?)?;
    m.add_function(wrap_pyfunction!(index_maps::device_placement_map, m)?)?;
    m.add_function(wrap_pyfunction!(index_maps::canonical_hlo_sharding, m)?)?;
    m.add_function(wrap_pyfunction!(transfer::device_put_leaf, m)?)?;
    m.add_function(wrap_pyfunction!(transfer::device_get_leaf, m)?)?;
    m.add_function(wrap_pyfunction!(transfer::transfer_cache_sizes, m)?)?;
    m.add_function(wrap_pyfunction!(
        process_local::make_array_from_process_local_leaf,
        m
    )?)?;
    m.add_function(wrap_pyfunction!(host_memory::set_host_pool_limit, m)?)?;
    m.add_function(wrap_pyfunction!(module_text::check_module_text, m)?)?;
    m.add_class::<dispatch::JitFunction>()?;
    m.add_class::<dispatch::DispatchCache>()?;
    m.add_class::<dispatch::BoundFunction>()?;
    m.add_class::<dispatch::FastPath>()?;
    m.add_class::<dispatch::CacheMiss>()?;
    m.add_function(wrap_pyfunction!(dispatch::clear_dispatch_memo, m)?)?;
    m.add_function(wrap_pyfunction!(dispatch::dispatch_memo_sizes, m)?)?;
    m.add_function(wrap_pyfunction!(dispatch::transfers_guarded, m)?)?;
    Ok(())
}
