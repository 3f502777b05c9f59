//! libFuzzer entry point for [`tela_fuzz::node_facade`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tela_fuzz::node_facade(data));
