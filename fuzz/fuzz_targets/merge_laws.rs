//! libFuzzer entry point for [`tela_fuzz::merge_laws`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tela_fuzz::merge_laws(data));
