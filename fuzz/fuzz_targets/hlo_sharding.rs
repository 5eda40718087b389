//! The HLO sharding parser on any bytes: it returns a sharding or an error, never panics, and
//! what it returns prints as text that reads back to the same sharding; index maps of what
//! fits a small device count compute without panicking.
#![no_main]

use fastpjit_core::{HloSharding, IndexMap};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(sharding) = HloSharding::parse(text) else {
        return;
    };
    let printed = sharding.to_string();
    let again = HloSharding::parse(&printed)
        .unwrap_or_else(|e| panic!("{text:?} printed as {printed:?}, which does not parse: {e}"));
    assert_eq!(again, sharding, "{text:?} printed as {printed:?}");
    for devices in 1..=16 {
        if sharding.check_for_array(devices).is_err() {
            continue;
        }
        for shape in [&[][..], &[16], &[8, 12], &[4, 6, 8]] {
            if let Ok(layout) = sharding.to_layout(shape.len(), devices) {
                if let Ok(map) = IndexMap::new(&layout, shape, devices) {
                    let mut bounds = vec![0i64; devices * shape.len() * 2];
                    map.write_bounds(&mut bounds);
                    let _ = map.replica_ids();
                    let _ = (0..devices).map(|d| map.member_of_device(d)).sum::<usize>();
                }
            }
        }
    }
});
