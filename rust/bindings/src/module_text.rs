//! The checks of a module's text that run before XLA's parsers read it (see
//! `fastpjit_core::module_precheck`): what XLA would abort or overflow its stack on.

use fastpjit_core::module_precheck::{check_hlo_text, check_mlir_text};
use pyo3::prelude::*;

use crate::errors::Error;

/// Raises `ValueError`, naming the line, where XLA's parser of `text` (HLO text, or MLIR text
/// where `mlir`) would crash the process instead of refusing it.
#[pyfunction]
pub fn check_module_text(py: Python<'_>, text: &str, mlir: bool) -> PyResult<()> {
    let checked = py.detach(|| {
        std::panic::catch_unwind(|| {
            if mlir {
                check_mlir_text(text)
            } else {
                check_hlo_text(text)
            }
        })
    });
    match checked {
        Ok(Ok(())) => Ok(()),
        Ok(Err(err)) => Err(Error::Value(
            format!(
                "malformed {}: {err}",
                if mlir { "MLIR module" } else { "HLO text" }
            )
            .into(),
        )
        .into()),
        // The checks are tested not to panic; should one, the text is refused all the same.
        Err(_) => {
            Err(Error::Value("malformed module: its text could not be checked".into()).into())
        }
    }
}
