//! How a node is set up ([`Config`]) and the settings it cannot run with ([`ConfigError`]).

use crate::auth::{Identity, Verifier};
use crate::hardware::Hardware;
use crate::id::NodeId;
use crate::intern::Interner;
use crate::membership::MembershipSettings;
use crate::record::{Reachability, Role};
use crate::swim::SwimConfigError;
use crate::wire::MAX_DATAGRAM;
use core::time::Duration;

/// How a node is set up. Build with [`Config::with_identity`] (production) or [`Config::new`]
/// (tests and simulations) and adjust fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// This node's identity; must be `identity.id()`.
    pub id: NodeId,
    /// The key this node signs its record and its DOWN marks with.
    pub identity: Identity,
    /// How records and marks from peers are checked.
    pub verifier: Verifier,
    /// Where merged records are kept: each its own (the default), or shared between the
    /// replicas of a simulation ([`Intern`](crate::Intern)).
    pub interner: Interner,
    /// The generation to start in; every new process of the same node must start higher than
    /// the last (runtimes use the wall-clock milliseconds at start). Should the federation still
    /// hold a record from an earlier process that this one does not supersede, the node moves
    /// to a generation above it by itself.
    pub generation: u64,
    /// What the node does.
    pub role: Role,
    /// GPUs it offers.
    pub hardware: Hardware,
    /// How peers reach it.
    pub reach: Reachability,
    /// Seed of the node's random choices (gossip peers, jitter).
    pub rng_seed: u64,
    /// How long before the walltime draining starts, and the longest a drain may take.
    pub drain_window: Duration,
    /// How long a node that has LEFT keeps spreading that news before asking to exit.
    pub leave_linger: Duration,
    /// Largest datagram to send, at most [`MAX_DATAGRAM`].
    pub max_datagram: usize,
    /// How the membership protocol runs: failure detection, gossip, anti-entropy, tombstones
    /// ([`MembershipSettings`]).
    pub membership: MembershipSettings,
}

impl Config {
    /// Defaults for a serving, outbound-only CPU node (1 s probe periods, gossip every 200 ms to
    /// 3 peers while there is news, 15-minute drain window; [`MembershipSettings::default`])
    /// that signs with `identity`, whose key owns its id, and checks peers strictly. What
    /// production runtimes use.
    pub fn with_identity(identity: Identity, generation: u64) -> Config {
        let mut c = Config::new(identity.id(), generation);
        c.identity = identity;
        c.verifier = Verifier::strict();
        c
    }

    /// The same defaults for a node with a *test identity* ([`Identity::for_test`]): a key anyone
    /// can compute from `id`, and a verifier that accepts such keys for [`NodeId::from_u64`] ids
    /// (and checks every other id strictly). For tests and simulations.
    pub fn new(id: NodeId, generation: u64) -> Config {
        Config {
            id,
            identity: Identity::for_test(id),
            verifier: Verifier::with_test_identities(),
            interner: Interner::default(),
            generation,
            role: Role::Serving,
            hardware: Hardware::CPU,
            reach: Reachability::OutboundOnly,
            rng_seed: id.short(),
            drain_window: Duration::from_secs(15 * 60),
            leave_linger: Duration::from_secs(1),
            max_datagram: MAX_DATAGRAM,
            membership: MembershipSettings::default(),
        }
    }

    /// Checks the settings that would make the node misbehave.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(256..=MAX_DATAGRAM).contains(&self.max_datagram) {
            return Err(ConfigError::MaxDatagram(self.max_datagram));
        }
        let m = &self.membership;
        m.detector.validate()?;
        let positive = [
            ("gossip_interval", m.gossip_interval),
            ("anti_entropy_interval", m.anti_entropy_interval),
            ("outbound_anti_entropy_interval", m.outbound_anti_entropy_interval),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, d)| d.is_zero()) {
            return Err(ConfigError::ZeroInterval(name));
        }
        if m.tombstone_ttl < m.anti_entropy_interval * 4 {
            return Err(ConfigError::TombstoneTtl { ttl: m.tombstone_ttl, interval: m.anti_entropy_interval });
        }
        if m.tombstone_ttl > crate::replica::MAX_TOMBSTONE_TTL {
            return Err(ConfigError::LongTombstoneTtl(m.tombstone_ttl));
        }
        if m.gossip_fanout == 0 {
            return Err(ConfigError::ZeroFanout);
        }
        if m.eager_sends == 0 {
            return Err(ConfigError::ZeroEagerSends);
        }
        if m.answers_per_round == Some(0) {
            return Err(ConfigError::ZeroAnswers);
        }
        Ok(())
    }
}

/// A configuration the node cannot run with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// An interval of zero would spin.
    #[error("{0} must be greater than zero")]
    ZeroInterval(&'static str),
    /// Datagram limit out of range.
    #[error("max_datagram {0} out of range 256..={MAX_DATAGRAM}")]
    MaxDatagram(usize),
    /// Nobody to gossip with.
    #[error("gossip_fanout must be at least 1")]
    ZeroFanout,
    /// Records would only ever be announced, never pushed.
    #[error("eager_sends must be at least 1")]
    ZeroEagerSends,
    /// Answers would never be sent.
    #[error("answers_per_round must be at least 1")]
    ZeroAnswers,
    /// Tombstones would be deleted before anti-entropy could spread them.
    #[error("tombstone_ttl ({ttl:?}) must be at least four anti_entropy_intervals ({interval:?}), and far longer than any partition expected to heal")]
    TombstoneTtl {
        /// The configured tombstone lifetime.
        ttl: Duration,
        /// The configured anti-entropy interval.
        interval: Duration,
    },
    /// Replicas time tombstones in wrapping milliseconds, which cannot count this far.
    #[error("tombstone_ttl ({0:?}) must be at most 2^31 ms (24 days)")]
    LongTombstoneTtl(Duration),
    /// The failure detector's settings cannot work.
    #[error("failure detector: {0}")]
    Swim(#[from] SwimConfigError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_validation_names_the_problem() {
        let mut c = Config::new(NodeId::from_u64(1), 1);
        assert_eq!(c.validate(), Ok(()));
        c.membership.gossip_interval = Duration::ZERO;
        assert_eq!(c.validate(), Err(ConfigError::ZeroInterval("gossip_interval")));
        c = Config::new(NodeId::from_u64(1), 1);
        c.membership.outbound_anti_entropy_interval = Duration::ZERO;
        assert_eq!(c.validate(), Err(ConfigError::ZeroInterval("outbound_anti_entropy_interval")));
        c = Config::new(NodeId::from_u64(1), 1);
        c.membership.eager_sends = 0;
        assert_eq!(c.validate(), Err(ConfigError::ZeroEagerSends));
        c = Config::new(NodeId::from_u64(1), 1);
        c.membership.detector.probe_timeout = c.membership.detector.protocol_period;
        assert!(c.validate().unwrap_err().to_string().contains("probe_timeout"));
        c = Config::new(NodeId::from_u64(1), 1);
        c.max_datagram = 5000;
        assert!(c.validate().is_err());
        c = Config::new(NodeId::from_u64(1), 1);
        c.membership.tombstone_ttl = Duration::from_secs(30 * 24 * 3600);
        assert_eq!(c.validate(), Err(ConfigError::LongTombstoneTtl(c.membership.tombstone_ttl)));
    }
}
