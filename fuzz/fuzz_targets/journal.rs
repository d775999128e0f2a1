#![no_main]

// See fencegate_fuzz::check_journal for the input format and the oracles.
libfuzzer_sys::fuzz_target!(|data: &[u8]| fencegate_fuzz::check_journal(data));
