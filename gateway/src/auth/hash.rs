//! Key hashes: the SHA-256 digest of a key as the key file writes it (`sha256:<hex>`), and new
//! random keys.

use rand::RngCore;
use sha2::{Digest, Sha256};

/// The SHA-256 digest of `key`, as the key file holds it.
pub(super) fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// The digest written as 64 hex digits, or `None` if `hex` is not one.
pub(super) fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// `bytes` as lowercase hex digits.
pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The key-file line for `key`: `sha256:<hex>`.
pub fn key_line(key: &str) -> String {
    format!("sha256:{}", hex(&digest(key)))
}

/// A new random key: `tela-` and 64 hex digits (256 bits).
pub fn generate_key() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("tela-{}", hex(&bytes))
}
