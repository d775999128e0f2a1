#![no_main]

// See fencegate_fuzz::check_canonical for the input format and the oracles.
libfuzzer_sys::fuzz_target!(|data: &[u8]| fencegate_fuzz::check_canonical(data));
