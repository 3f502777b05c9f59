//! libFuzzer entry point for [`tela_fuzz::wire_decode`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tela_fuzz::wire_decode(data));
