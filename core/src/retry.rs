//! Retrying a request before its first response byte: the one policy the gateway's proxy and
//! the simulator both follow.
//!
//! Until a response's head has arrived nothing has reached the client, so a request may move
//! to another node: when the stream cannot be opened, the connection breaks, the node does not
//! accept it, or the node answers `503` (draining) or `502` (its engine is unreachable). Each
//! attempt goes to a node not yet tried for this request, at most `max_attempts` in all. Once a
//! head arrives on the last attempt it is the client's, whatever its status.
//!
//! ```
//! use tela_core::retry::{Attempts, Next, Outcome};
//! use tela_core::NodeId;
//!
//! let mut attempts = Attempts::new(2);
//! attempts.begin(NodeId::from_u64(1));
//! assert_eq!(attempts.after(Outcome::Answered(503)), Next::Retry);
//! assert!(!attempts.untried(&NodeId::from_u64(1)));
//! attempts.begin(NodeId::from_u64(2));
//! assert_eq!(attempts.after(Outcome::Answered(503)), Next::Respond, "the last answer is the client's");
//! ```

use crate::id::NodeId;

/// What one attempt on a node came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The node answered: the response head with this status has arrived.
    Answered(u16),
    /// No response head: the stream could not be opened or written, the connection broke, or
    /// the node did not accept the request in time.
    Failed,
}

/// What to do after an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Send this response to the client.
    Respond,
    /// Try another node not yet tried.
    Retry,
    /// No attempt is left: the request fails with no capacity.
    GiveUp,
}

/// The nodes tried for one request and how many attempts it may make.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempts {
    max: usize,
    tried: Vec<NodeId>,
}

impl Attempts {
    /// A request that may try `max_attempts` nodes (at least one).
    pub fn new(max_attempts: usize) -> Attempts {
        Attempts { max: max_attempts.max(1), tried: Vec::new() }
    }

    /// The nodes tried so far, in order.
    pub fn tried(&self) -> &[NodeId] {
        &self.tried
    }

    /// True if `node` has not been tried for this request (routing passes over the others).
    pub fn untried(&self, node: &NodeId) -> bool {
        !self.tried.contains(node)
    }

    /// True while another attempt may start.
    pub fn left(&self) -> bool {
        self.tried.len() < self.max
    }

    /// An attempt on `node` starts.
    pub fn begin(&mut self, node: NodeId) {
        self.tried.push(node);
    }

    /// What to do after the attempt that started last came to `outcome`.
    pub fn after(&self, outcome: Outcome) -> Next {
        match outcome {
            Outcome::Answered(502 | 503) if self.left() => Next::Retry,
            Outcome::Answered(_) => Next::Respond,
            Outcome::Failed if self.left() => Next::Retry,
            Outcome::Failed => Next::GiveUp,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_move_on_until_the_attempts_run_out_and_answers_are_kept() {
        let n = NodeId::from_u64;
        let mut a = Attempts::new(3);
        assert!(a.left() && a.tried().is_empty());
        a.begin(n(1));
        assert_eq!(a.after(Outcome::Answered(200)), Next::Respond);
        assert_eq!(a.after(Outcome::Answered(429)), Next::Respond, "only 502 and 503 move on");
        assert_eq!(a.after(Outcome::Answered(502)), Next::Retry);
        assert_eq!(a.after(Outcome::Failed), Next::Retry);
        a.begin(n(2));
        a.begin(n(3));
        assert!(!a.left());
        assert_eq!(a.tried(), [n(1), n(2), n(3)]);
        assert!(!a.untried(&n(2)) && a.untried(&n(4)));
        assert_eq!(a.after(Outcome::Failed), Next::GiveUp);
        assert_eq!(a.after(Outcome::Answered(503)), Next::Respond, "the last head is the client's");
        // At least one attempt, whatever the setting.
        let mut one = Attempts::new(0);
        assert!(one.left());
        one.begin(n(1));
        assert_eq!(one.after(Outcome::Failed), Next::GiveUp);
    }
}
