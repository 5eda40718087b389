//! `fastpjit._core`: the PyO3 layer over `fastpjit_core`. It converts types and nothing more.
use pyo3::prelude::*;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
