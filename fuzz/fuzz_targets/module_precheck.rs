//! The checks that run on a module's text before XLA's parsers (`module_precheck`) on any
//! bytes: they pass or name a line of the text, never panic, and take time linear in the text
//! (libFuzzer's `-timeout` catches a quadratic case on long inputs).
#![no_main]

use fastpjit_core::module_precheck::{check_hlo_text, check_mlir_text};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let lines = text.split('\n').count();
    for checked in [check_hlo_text(text), check_mlir_text(text)] {
        if let Err(err) = checked {
            assert!(
                (1..=lines).contains(&err.line),
                "{err} names no line of {lines}"
            );
        }
    }
});
