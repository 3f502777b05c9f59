//! Fuzz targets for Tela's protocol core, as plain functions over bytes.
//!
//! Each target is a `pub fn(&[u8])` that panics when a property of `tela-core` breaks:
//!
//! - [`wire_decode`]: decoding any datagram never panics, and whatever decodes survives a round
//!   trip through the encoder;
//! - [`merge_laws`]: the record merge is a join semilattice (commutative, associative,
//!   idempotent) and `dominates` agrees with it, also through a [`tela_core::Replica`];
//! - [`node_facade`]: a [`tela_core::Node`] fed an arbitrary sequence of inputs never panics, sends
//!   no oversized datagram, never moves its own record backwards and keeps its routing index in
//!   step with its records.
//!
//! The libFuzzer binaries in `fuzz_targets/` call these functions (feature `libfuzzer`, built by
//! `cargo fuzz`); the test `tests/corpus.rs` runs the seed corpus in `corpus/<target>/` through
//! them under a plain `cargo test`, so the seeds stay valid on stable Rust. See `README.md`.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod facade;
mod lattice;
#[cfg(test)]
mod seeds;

use tela_core::harness::wire::{self, Message};

pub use facade::node_facade;
pub use lattice::merge_laws;

/// Decodes `data` as a datagram: never panics, and a message that decodes re-encodes to a
/// datagram no longer than the input that decodes to the same message.
pub fn wire_decode(data: &[u8]) {
    let Ok(msg) = wire::decode(data) else {
        return;
    };
    if let Message::Records(records) = &msg {
        for r in records {
            assert_eq!(r.validate(), Ok(()), "decode let an invalid record through");
        }
    }
    let encoded = wire::encode_unbounded(&msg);
    // The encoder writes the shortest form, so a message never grows on re-encoding.
    assert!(encoded.len() <= data.len(), "{} input bytes re-encode to {}", data.len(), encoded.len());
    match wire::decode(&encoded) {
        Ok(again) => assert_eq!(again, msg, "round trip changed the message"),
        Err(e) => panic!("re-encoded message does not decode: {e}"),
    }
}
