//! How a federation's members spread records and judge liveness: every member of one
//! federation must use the same mode.

use core::fmt;
use core::str::FromStr;
use tela_core::{Config, Dissemination, SwimSettings};

/// The membership protocol (`--membership`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Membership {
    /// Push-pull of digests with heartbeats: simple, for federations of up to a few hundred
    /// members (every member learns every heartbeat).
    #[default]
    PushPull,
    /// SWIM probing with Lifeguard suspicion, updates piggybacked on probes and hashed-bucket
    /// anti-entropy: traffic per member stays flat as the federation grows to thousands.
    Swim,
}

impl Membership {
    /// Sets the core's dissemination to this mode.
    pub fn apply(self, config: &mut Config) {
        config.dissemination = match self {
            Membership::PushPull => Dissemination::PushPull,
            Membership::Swim => Dissemination::Swim(SwimSettings::default()),
        };
    }
}

/// An unknown membership mode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' is not a membership protocol: use push-pull or swim")]
pub struct UnknownMembership(pub String);

impl FromStr for Membership {
    type Err = UnknownMembership;

    fn from_str(s: &str) -> Result<Membership, UnknownMembership> {
        match s.trim().to_ascii_lowercase().as_str() {
            "push-pull" | "pushpull" => Ok(Membership::PushPull),
            "swim" => Ok(Membership::Swim),
            _ => Err(UnknownMembership(s.to_string())),
        }
    }
}

impl fmt::Display for Membership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Membership::PushPull => "push-pull",
            Membership::Swim => "swim",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_print_and_apply() {
        for m in [Membership::PushPull, Membership::Swim] {
            assert_eq!(m.to_string().parse::<Membership>(), Ok(m));
        }
        assert_eq!("SWIM".parse::<Membership>(), Ok(Membership::Swim));
        assert!("gossip".parse::<Membership>().unwrap_err().to_string().contains("push-pull or swim"));
        let mut c = Config::new(tela_core::NodeId::from_u64(1), 1);
        Membership::Swim.apply(&mut c);
        assert!(matches!(c.dissemination, Dissemination::Swim(_)));
        assert_eq!(c.validate(), Ok(()));
    }
}
