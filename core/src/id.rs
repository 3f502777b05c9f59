//! Node identity.

use core::fmt;
use serde::{Deserialize, Serialize};

/// A node's identity in the federation: 16 bytes, stable across restarts of the same node.
///
/// The runtime derives it from the node's persistent identity key; the simulator and the tests
/// derive it from a number with [`NodeId::from_u64`]. The core treats it as opaque.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
pub struct NodeId(pub [u8; 16]);

impl NodeId {
    /// A deterministic id for tests and simulations: `n` in the last eight bytes, big-endian.
    pub const fn from_u64(n: u64) -> NodeId {
        let b = n.to_be_bytes();
        NodeId([0, 0, 0, 0, 0, 0, 0, 0, b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
    }

    /// All sixteen bytes as 32 lowercase hex digits (the display form is shortened).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses the 32 hex digits [`NodeId::to_hex`] writes; anything else is `None`.
    pub fn from_hex(text: &str) -> Option<NodeId> {
        let text = text.as_bytes();
        if text.len() != 32 {
            return None;
        }
        let digit = |c: u8| (c as char).to_digit(16).and_then(|d| u8::try_from(d).ok());
        let mut id = [0u8; 16];
        for (byte, pair) in id.iter_mut().zip(text.chunks_exact(2)) {
            *byte = digit(pair[0])? << 4 | digit(pair[1])?;
        }
        Some(NodeId(id))
    }

    /// The first eight bytes as a number; cheap to hash and to print.
    pub fn short(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[8..]);
        u64::from_be_bytes(b)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Eight hex digits are enough to tell nodes apart in logs and tables.
        for b in &self.0[..2] {
            write!(f, "{b:02x}")?;
        }
        for b in &self.0[14..] {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeId(")?;
        for b in &self.0 {
            write!(f, "{b:02x}")?;
        }
        write!(f, ")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_from_numbers_are_distinct_and_ordered() {
        assert!(NodeId::from_u64(1) < NodeId::from_u64(2));
        assert_eq!(NodeId::from_u64(7).short(), 7);
        assert_eq!(NodeId::from_u64(0x1234).to_string(), "00001234");
    }

    #[test]
    fn hex_round_trips_and_refuses_anything_else() {
        let id = NodeId(core::array::from_fn(|i| (i as u8).wrapping_mul(37)));
        assert_eq!(NodeId::from_hex(&id.to_hex()), Some(id));
        assert_eq!(NodeId::from_hex(&id.to_hex().to_uppercase()), Some(id));
        assert_eq!(NodeId::from_hex("00"), None);
        assert_eq!(NodeId::from_hex(&"g".repeat(32)), None);
        assert_eq!(NodeId::from_hex(&"é".repeat(16)), None);
    }
}
