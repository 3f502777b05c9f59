//! [`judge`]: what one readiness probe says about a ready engine, given the traffic that
//! flowed meanwhile — the decision of [`super::supervise`], kept pure so that it is tested
//! without engines or clocks.
//!
//! A probe that times out while the engine is demonstrably working for this node — requests
//! in flight and bytes arriving from it, or requests completed since the last probe — is not
//! a failure: engines that serve one request at a time (llama-cpp-python) queue the probe
//! behind a long generation. A timeout with nothing flowing, and every other failure (refused
//! connection, an error status, a bad model list), counts.

use super::backend::ProbeError;
use super::traffic::Flow;

/// How one probe ended, as far as the verdict goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// The engine answered it as a ready engine does.
    Answered,
    /// No answer within the probe timeout.
    TimedOut,
    /// Anything else: refused, reset, an error status, no model list.
    Failed,
}

impl ProbeOutcome {
    /// The outcome of a probe's result.
    pub fn of<T>(result: &Result<T, ProbeError>) -> ProbeOutcome {
        match result {
            Ok(_) => ProbeOutcome::Answered,
            Err(ProbeError::TimedOut { .. }) => ProbeOutcome::TimedOut,
            Err(_) => ProbeOutcome::Failed,
        }
    }
}

/// What a probe of a ready engine means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// It answered: ready.
    Healthy,
    /// It timed out, but the engine is sending this node's requests their answers: alive,
    /// only busy. The count of failures starts again.
    Busy,
    /// A failure; this many in a row now.
    Failing(u32),
}

impl Flow {
    /// Whether the engine is evidently working: bytes arriving for requests in flight, or
    /// requests completed.
    pub fn progressing(&self) -> bool {
        (self.in_flight > 0 && self.bytes) || self.completed > 0
    }
}

/// The verdict on a probe that ended in `outcome` after `failures` failures in a row, with
/// `flow` the traffic since the probe before.
pub fn judge(outcome: ProbeOutcome, flow: Flow, failures: u32) -> Verdict {
    match outcome {
        ProbeOutcome::Answered => Verdict::Healthy,
        ProbeOutcome::TimedOut if flow.progressing() => Verdict::Busy,
        ProbeOutcome::TimedOut | ProbeOutcome::Failed => Verdict::Failing(failures.saturating_add(1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const STREAMING: Flow = Flow { in_flight: 1, bytes: true, completed: 0 };
    const FINISHED: Flow = Flow { in_flight: 0, bytes: true, completed: 2 };
    const SILENT: Flow = Flow { in_flight: 1, bytes: false, completed: 0 };
    const IDLE: Flow = Flow { in_flight: 0, bytes: false, completed: 0 };

    #[test]
    fn a_timeout_while_answers_flow_is_busy_not_failed() {
        assert_eq!(judge(ProbeOutcome::TimedOut, STREAMING, 2), Verdict::Busy);
        assert_eq!(judge(ProbeOutcome::TimedOut, FINISHED, 2), Verdict::Busy);
        // Many probes in a row behind a long generation never add up to DOWN.
        let mut failures = 0;
        for _ in 0..100 {
            match judge(ProbeOutcome::TimedOut, STREAMING, failures) {
                Verdict::Failing(n) => failures = n,
                Verdict::Busy | Verdict::Healthy => failures = 0,
            }
        }
        assert_eq!(failures, 0);
    }

    #[test]
    fn a_timeout_with_nothing_flowing_counts() {
        assert_eq!(judge(ProbeOutcome::TimedOut, IDLE, 0), Verdict::Failing(1));
        // Requests in flight but not a byte from the engine: stuck, not busy.
        assert_eq!(judge(ProbeOutcome::TimedOut, SILENT, 2), Verdict::Failing(3));
        // A byte left over from a request that ended without completing is no evidence.
        assert_eq!(
            judge(ProbeOutcome::TimedOut, Flow { in_flight: 0, bytes: true, completed: 0 }, 0),
            Verdict::Failing(1)
        );
    }

    #[test]
    fn refusals_and_errors_count_even_while_streams_flow() {
        // A dead engine is detected promptly even if a last byte arrived before it died.
        assert_eq!(judge(ProbeOutcome::Failed, STREAMING, 0), Verdict::Failing(1));
        assert_eq!(judge(ProbeOutcome::Failed, FINISHED, 2), Verdict::Failing(3));
        assert_eq!(judge(ProbeOutcome::Answered, IDLE, 2), Verdict::Healthy);
    }

    #[test]
    fn outcomes_come_from_probe_errors() {
        let url = String::from("http://127.0.0.1:1/health");
        let timed_out: Result<(), _> = Err(ProbeError::TimedOut { url: url.clone(), after: Duration::from_secs(5) });
        let refused: Result<(), _> = Err(ProbeError::Unreachable { url, detail: "connection refused".into() });
        assert_eq!(ProbeOutcome::of(&timed_out), ProbeOutcome::TimedOut);
        assert_eq!(ProbeOutcome::of(&refused), ProbeOutcome::Failed);
        assert_eq!(ProbeOutcome::of(&Ok::<(), ProbeError>(())), ProbeOutcome::Answered);
    }
}
