//! Named random streams split from one root seed.
//!
//! Each concern draws from its own ChaCha8 stream (same key, different stream number), so
//! removing one fault, or one node, does not shift the draws of every other concern.

use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;

/// The stream numbers of the named streams; nodes use `NODE_BASE + host`.
#[derive(Clone, Copy, Debug)]
pub enum Stream {
    /// Latency, jitter, loss, duplication, reordering.
    Network = 1,
    /// Which faults happen when.
    Faults = 2,
    /// Client arrivals, models, token counts, routing draws.
    Workload = 3,
    /// Topology: sites, reachability, hardware, clocks.
    World = 4,
    /// Swarm mode's draw of the fault mix.
    Swarm = 5,
    /// Model spinning: batch queue waits and preemptions of the spinner's jobs.
    Spin = 6,
    /// The jitter of redials after a lost or refused connection.
    Dial = 7,
}

const NODE_BASE: u64 = 1 << 32;

/// A stream of the root seed.
pub fn stream(root: u64, s: Stream) -> ChaCha8Rng {
    let mut r = ChaCha8Rng::seed_from_u64(root);
    r.set_stream(s as u64);
    r
}

/// The seed of a node's own core RNG for one incarnation (job) of one host.
pub fn node_seed(root: u64, host: u32, job: u32) -> u64 {
    use rand_core::RngCore;
    let mut r = ChaCha8Rng::seed_from_u64(root);
    r.set_stream(NODE_BASE + u64::from(host));
    r.set_word_pos(u128::from(job) * 16);
    r.next_u64()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_core::RngCore;

    #[test]
    fn streams_are_independent_and_reproducible() {
        let a = stream(7, Stream::Network).next_u64();
        assert_eq!(a, stream(7, Stream::Network).next_u64());
        assert_ne!(a, stream(7, Stream::Faults).next_u64());
        assert_ne!(a, stream(8, Stream::Network).next_u64());
        assert_ne!(node_seed(1, 3, 1), node_seed(1, 3, 2));
        assert_ne!(node_seed(1, 3, 1), node_seed(1, 4, 1));
    }
}
