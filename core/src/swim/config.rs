//! The failure detector's settings and the Lifeguard suspicion timing they imply.

use crate::broadcast::{log2_fixed, LOG2_ONE};
use core::time::Duration;

/// The most confirmations a suspicion counts ([`SwimConfig::suspicion_confirmations`]):
/// Lifeguard's own value. Each suspicion holds its suspecters inline, and a cut at 10,000 nodes
/// holds 22 million suspicions at once.
pub const MOST_CONFIRMATIONS: u32 = 3;

/// Failure detector settings. [`SwimConfig::default`] gives memberlist's LAN values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SwimConfig {
    /// Time between probes at full local health.
    pub protocol_period: Duration,
    /// How long to wait for a direct ack before probing indirectly; less than the period.
    pub probe_timeout: Duration,
    /// Members asked to probe indirectly (`k` in SWIM).
    pub indirect_probes: usize,
    /// Shortest suspicion, in protocol periods per decade of cluster size (`alpha`).
    pub suspicion_min_periods: u32,
    /// Longest suspicion, in protocol periods per decade of cluster size (`beta`).
    pub suspicion_max_periods: u32,
    /// Independent confirmations that shrink a suspicion to its shortest (`K` in Lifeguard), at
    /// most [`MOST_CONFIRMATIONS`].
    pub suspicion_confirmations: u32,
    /// Highest local health multiplier; timeouts stretch up to `max_health + 1` times.
    pub max_health: u8,
    /// An anchor suspects an outbound-only member it vouches for after hearing nothing from it
    /// for this long; it pings the member after a third of it in silence. Nobody else can probe
    /// such a member, and a killed process's connection only times out much later.
    pub vouch_lease: Duration,
}

impl Default for SwimConfig {
    /// 1 s periods, 500 ms probe timeout, 3 indirect probes, suspicion 4 to 24 periods per decade
    /// of cluster size shrinking over 3 confirmations, local health up to 8, 3 s vouch leases.
    fn default() -> SwimConfig {
        SwimConfig {
            protocol_period: Duration::from_secs(1),
            probe_timeout: Duration::from_millis(500),
            indirect_probes: 3,
            suspicion_min_periods: 4,
            suspicion_max_periods: 24,
            suspicion_confirmations: 3,
            max_health: 8,
            vouch_lease: Duration::from_secs(3),
        }
    }
}

impl SwimConfig {
    /// Checks the settings that would make the detector misbehave.
    pub fn validate(&self) -> Result<(), SwimConfigError> {
        if self.protocol_period < Duration::from_millis(1) {
            return Err(SwimConfigError::ZeroPeriod);
        }
        if self.probe_timeout.is_zero() || self.probe_timeout >= self.protocol_period {
            return Err(SwimConfigError::ProbeTimeout { timeout: self.probe_timeout, period: self.protocol_period });
        }
        if self.suspicion_min_periods == 0 || self.suspicion_max_periods < self.suspicion_min_periods {
            return Err(SwimConfigError::SuspicionBounds {
                min: self.suspicion_min_periods,
                max: self.suspicion_max_periods,
            });
        }
        if self.suspicion_confirmations > MOST_CONFIRMATIONS {
            return Err(SwimConfigError::Confirmations { confirmations: self.suspicion_confirmations });
        }
        if self.vouch_lease < self.protocol_period {
            return Err(SwimConfigError::VouchLease { lease: self.vouch_lease, period: self.protocol_period });
        }
        Ok(())
    }

    /// A copy with out-of-range values clamped to the nearest usable ones.
    pub(super) fn clamped(mut self) -> SwimConfig {
        self.protocol_period = self.protocol_period.max(Duration::from_millis(1));
        if self.probe_timeout.is_zero() || self.probe_timeout >= self.protocol_period {
            self.probe_timeout = self.protocol_period / 2;
        }
        self.suspicion_min_periods = self.suspicion_min_periods.max(1);
        self.suspicion_max_periods = self.suspicion_max_periods.max(self.suspicion_min_periods);
        self.suspicion_confirmations = self.suspicion_confirmations.min(MOST_CONFIRMATIONS);
        self.vouch_lease = self.vouch_lease.max(self.protocol_period);
        self
    }

    /// Shortest and longest suspicion timeout in a cluster of `cluster_size` nodes:
    /// `alpha · max(1, log10 n) · period` and `beta · max(1, log10 n) · period`.
    pub fn suspicion_bounds(&self, cluster_size: usize) -> (Duration, Duration) {
        let n = u64::try_from(cluster_size).unwrap_or(u64::MAX);
        // log10(n) = log2(n) / log2(10), in the same fixed point; at least 1.
        let log10 =
            (u128::from(log2_fixed(n)) * u128::from(LOG2_ONE) / u128::from(log2_fixed(10))).max(u128::from(LOG2_ONE));
        let period = self.protocol_period.as_micros();
        let scaled = |periods: u32| {
            let micros = period * u128::from(periods) * log10 / u128::from(LOG2_ONE);
            Duration::from_micros(u64::try_from(micros).unwrap_or(u64::MAX))
        };
        (scaled(self.suspicion_min_periods), scaled(self.suspicion_max_periods))
    }
}

/// A failure detector configuration that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SwimConfigError {
    /// A period under a millisecond would spin.
    #[error("protocol_period must be at least 1 ms")]
    ZeroPeriod,
    /// The direct probe must leave time for the indirect one within the period.
    #[error("probe_timeout ({timeout:?}) must be above zero and below protocol_period ({period:?})")]
    ProbeTimeout {
        /// The configured probe timeout.
        timeout: Duration,
        /// The configured period.
        period: Duration,
    },
    /// Suspicion bounds out of order.
    #[error("suspicion periods must satisfy 1 <= min ({min}) <= max ({max})")]
    SuspicionBounds {
        /// The configured minimum.
        min: u32,
        /// The configured maximum.
        max: u32,
    },
    /// More confirmations than a suspicion can count.
    #[error("suspicion_confirmations ({confirmations}) must be at most {MOST_CONFIRMATIONS}")]
    Confirmations {
        /// The configured confirmations.
        confirmations: u32,
    },
    /// A lease shorter than a period would suspect members between two pings.
    #[error("vouch_lease ({lease:?}) must be at least protocol_period ({period:?})")]
    VouchLease {
        /// The configured lease.
        lease: Duration,
        /// The configured period.
        period: Duration,
    },
}

/// The Lifeguard suspicion timeout after `confirmations` independent confirmations out of
/// `expected`: `max(min, max − (max − min) · log(C + 1) / log(K + 1))`, or `min` when none are
/// expected. Non-increasing in `confirmations` and always within `[min, max]` (for `min ≤ max`).
pub(crate) fn suspicion_timeout(min: Duration, max: Duration, confirmations: u32, expected: u32) -> Duration {
    if expected == 0 || max <= min {
        return min;
    }
    let c = confirmations.min(expected);
    let num = u128::from(log2_fixed(u64::from(c) + 1));
    let den = u128::from(log2_fixed(u64::from(expected) + 1)).max(1);
    let span = (max - min).as_micros();
    let cut = span * num / den;
    let left = span.saturating_sub(cut);
    min + Duration::from_micros(u64::try_from(left).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn config() -> SwimConfig {
        SwimConfig::default()
    }

    #[test]
    fn config_validation_names_the_problem() {
        assert_eq!(config().validate(), Ok(()));
        let mut c = config();
        c.probe_timeout = c.protocol_period;
        assert!(c.validate().unwrap_err().to_string().contains("probe_timeout"));
        c = config();
        c.suspicion_max_periods = 1;
        assert!(matches!(c.validate(), Err(SwimConfigError::SuspicionBounds { .. })));
        c = config();
        c.suspicion_confirmations = MOST_CONFIRMATIONS + 1;
        assert!(c.validate().unwrap_err().to_string().contains("suspicion_confirmations (4) must be at most 3"));
        assert_eq!(c.clone().clamped().suspicion_confirmations, MOST_CONFIRMATIONS);
        c = config();
        c.protocol_period = Duration::ZERO;
        assert_eq!(c.validate(), Err(SwimConfigError::ZeroPeriod));
        let mut short = config();
        short.vouch_lease = short.protocol_period / 2;
        assert!(short.validate().unwrap_err().to_string().contains("vouch_lease"));
        assert_eq!(short.clamped().vouch_lease, config().protocol_period);
        let c = c.clamped();
        assert_eq!(c.validate(), Ok(()));
        assert_eq!((c.protocol_period, c.probe_timeout), (Duration::from_millis(1), Duration::from_micros(500)));
    }

    proptest! {
        #[test]
        fn suspicion_timeout_is_within_bounds_and_non_increasing(
            min_ms in 0u64..100_000,
            extra_ms in 0u64..100_000,
            expected in 0u32..12,
        ) {
            let (min, max) = (Duration::from_millis(min_ms), Duration::from_millis(min_ms + extra_ms));
            let mut last = max;
            for c in 0..=expected + 2 {
                let t = suspicion_timeout(min, max, c, expected);
                prop_assert!(t >= min && t <= max, "{:?} outside [{:?}, {:?}]", t, min, max);
                prop_assert!(t <= last, "grew with confirmation {}", c);
                last = t;
            }
            prop_assert_eq!(suspicion_timeout(min, max, expected, expected), min);
            if expected > 0 {
                prop_assert_eq!(suspicion_timeout(min, max, 0, expected), max);
            }
        }

        #[test]
        fn suspicion_bounds_grow_with_the_cluster(a in 1usize..100_000, b in 1usize..100_000) {
            let c = config();
            let (small, large) = (a.min(b), a.max(b));
            let (min_s, max_s) = c.suspicion_bounds(small);
            let (min_l, max_l) = c.suspicion_bounds(large);
            prop_assert!(min_s <= min_l && max_s <= max_l);
            prop_assert!(min_s <= max_s && min_s >= c.protocol_period * c.suspicion_min_periods);
        }

    }
}
