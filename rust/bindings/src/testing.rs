//! What the bindings' tests share: Python modules of helpers and oracles, made from their code
//! once per test process.

use std::ffi::{CStr, CString};

use pyo3::prelude::*;
use pyo3::types::PyModule;

/// The module `name` of `code`: made on first use, found by its name after.
pub fn helper_module<'py>(py: Python<'py>, name: &CStr, code: &CStr) -> Bound<'py, PyModule> {
    let text = name.to_str().unwrap();
    py.import(text).unwrap_or_else(|_| {
        let file = CString::new(format!("{text}.py")).unwrap();
        PyModule::from_code(py, code, &file, name).unwrap()
    })
}

/// The items of the list that `module.name()` gives.
pub fn items<'py>(module: &Bound<'py, PyModule>, name: &str) -> Vec<Bound<'py, PyAny>> {
    module.call_method0(name).unwrap().extract().unwrap()
}
