//! One request's accounting ([`Charge`]): who pays ([`Payer`], [`key_hash`]), what was asked
//! ([`Asked`]), and, once the response has ended, the key's limits, `/metrics` and the
//! ledger's row, all told at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::body::{BodyEnd, Ending};
use crate::limits::Settlement;
use crate::metrics::{KeyLabel, KeyTokenLabels, Metrics, ModelTokenLabels};

use super::{unix_ms, Ledger, Row};

/// The first 12 hex digits of the SHA-256 of the key a request presents (`Authorization:
/// Bearer <key>` or `api-key: <key>`, read as [`crate::auth::Access::check`] reads them).
pub fn key_hash(authorization: Option<&[u8]>, api_key: Option<&[u8]>) -> Option<String> {
    let key = match (authorization, api_key) {
        (Some(h), _) => {
            let (scheme, key) = std::str::from_utf8(h).ok()?.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| key.trim().to_string())?
        }
        (None, Some(k)) => String::from_utf8_lossy(k).trim().to_string(),
        (None, None) => return None,
    };
    let line = crate::auth::key_line(&key);
    line.strip_prefix("sha256:").map(|hex| hex[..12.min(hex.len())].to_string())
}

/// Who a request is charged to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Payer {
    /// The key's name.
    pub key: String,
    /// Its hash prefix ([`key_hash`]).
    pub hash: Option<String>,
    /// The account its line charges.
    pub account: Option<String>,
}

/// One request's accounting, told once how it ended: the key's limits learn the engine's
/// token counts ([`Settlement::usage`]), `/metrics` counts the request and its tokens per key
/// and model, and the ledger gets its row. Clones share one record; the first report wins.
#[derive(Clone)]
pub struct Charge(Arc<ChargeState>);

struct ChargeState {
    done: AtomicBool,
    arrived_ms: i64,
    started: Instant,
    payer: Option<Payer>,
    model: String,
    endpoint: String,
    stream: bool,
    settlement: Option<Settlement>,
    ledger: Option<Ledger>,
    metrics: Arc<Metrics>,
}

/// What a request asked for, for its [`Charge`].
#[derive(Clone, Debug)]
pub struct Asked {
    /// The model.
    pub model: String,
    /// The path.
    pub endpoint: String,
    /// Whether it streams.
    pub stream: bool,
    /// When it arrived (wall clock, for the row's time).
    pub arrived: SystemTime,
    /// When it arrived (for its latency).
    pub started: Instant,
}

impl Charge {
    /// The accounting of a request `asked` by `payer` (`None` on a gateway without keys).
    pub fn new(
        metrics: Arc<Metrics>,
        ledger: Option<Ledger>,
        payer: Option<Payer>,
        asked: Asked,
        settlement: Option<Settlement>,
    ) -> Charge {
        Charge(Arc::new(ChargeState {
            done: AtomicBool::new(false),
            arrived_ms: unix_ms(asked.arrived),
            started: asked.started,
            payer,
            model: asked.model,
            endpoint: asked.endpoint,
            stream: asked.stream,
            settlement,
            ledger,
            metrics,
        }))
    }

    /// The gateway answered `status` itself (a refusal, no node, an error before any node
    /// answered): no tokens.
    pub fn refused(&self, status: u16) {
        self.settle(None, None, status, "refused", None, None);
    }

    /// `node`'s response, sent with `status`, ended as `ending` says.
    pub fn ended(&self, node: &str, status: u16, ending: &Ending) {
        self.settle(Some(node), None, status, outcome(ending), ending.usage, ending.first_byte);
    }

    /// The overflow `provider`'s response ([`crate::overflow`]), sent with `status`, ended as
    /// `ending` says: charged as a node's, its row marked with the provider.
    pub fn overflowed(&self, provider: &str, status: u16, ending: &Ending) {
        let node = format!("overflow:{provider}");
        self.settle(Some(&node), Some(provider), status, outcome(ending), ending.usage, ending.first_byte);
    }

    /// The overflow `provider` could not be reached or did not answer: the gateway answered
    /// `status` itself, no tokens.
    pub fn provider_failed(&self, provider: &str, status: u16) {
        self.settle(None, Some(provider), status, "refused", None, None);
    }

    fn settle(
        &self,
        node: Option<&str>,
        provider: Option<&str>,
        status: u16,
        outcome: &'static str,
        usage: Option<crate::body::EngineUsage>,
        first_byte: Option<Instant>,
    ) {
        let s = &*self.0;
        if s.done.swap(true, Ordering::AcqRel) {
            return;
        }
        if let (Some(settlement), Some(usage)) = (&s.settlement, usage) {
            settlement.usage(usage.total_tokens);
        }
        let (prompt, completion) = usage.map_or((0, 0), |u| (u.prompt_tokens, u.completion_tokens));
        for (kind, n) in [("prompt", prompt), ("completion", completion)] {
            if n == 0 {
                continue;
            }
            let model = ModelTokenLabels { model: s.model.clone(), kind: kind.into() };
            s.metrics.model_tokens.get_or_create(&model).inc_by(n);
            if let Some(payer) = &s.payer {
                let key = KeyTokenLabels { key: payer.key.clone(), kind: kind.into() };
                s.metrics.key_tokens.get_or_create(&key).inc_by(n);
            }
        }
        if let Some(payer) = &s.payer {
            s.metrics.key_requests.get_or_create(&KeyLabel { key: payer.key.clone() }).inc();
        }
        let Some(ledger) = &s.ledger else { return };
        let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        ledger.record(Row {
            time_ms: s.arrived_ms,
            key_name: s.payer.as_ref().map(|p| p.key.clone()),
            key_hash: s.payer.as_ref().and_then(|p| p.hash.clone()),
            account: s.payer.as_ref().and_then(|p| p.account.clone()),
            model: s.model.clone(),
            node: node.map(str::to_string),
            endpoint: s.endpoint.clone(),
            stream: s.stream,
            status,
            outcome,
            prompt_tokens: usage.map(|u| u.prompt_tokens),
            completion_tokens: usage.map(|u| u.completion_tokens),
            latency_ms: millis(s.started.elapsed()),
            ttft_ms: first_byte.map(|t| millis(t.saturating_duration_since(s.started))),
            provider: provider.map(str::to_string),
        });
    }
}

fn outcome(ending: &Ending) -> &'static str {
    match ending.how {
        BodyEnd::Complete => "complete",
        BodyEnd::Broken => "broken",
        BodyEnd::Abandoned => "abandoned",
    }
}

/// What a streamed response tells when it ends ([`crate::body::OnEnd`]): its duration (per
/// `model` and `stream`, from `started`) and whether it broke go to `metrics`, and `report`
/// tells its [`Charge`], if any, how it ended.
pub fn on_end(
    metrics: Arc<Metrics>,
    model: &str,
    stream: bool,
    started: Instant,
    charge: Option<Charge>,
    report: impl Fn(&Charge, &Ending) + Send + Sync + 'static,
) -> crate::body::OnEnd {
    let labels = crate::metrics::DurationLabels { model: model.to_string(), stream };
    Box::new(move |end: Ending| {
        metrics.duration.get_or_create(&labels).observe(started.elapsed().as_secs_f64());
        if end.how == BodyEnd::Broken {
            metrics.broken.inc();
        }
        if let Some(charge) = &charge {
            report(charge, &end);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::LedgerConfig;

    #[test]
    fn charges_report_once_to_limits_metrics_and_the_ledger() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("gateway.db");
        let metrics = Arc::new(Metrics::new());
        let ledger = Ledger::start(LedgerConfig::new(path.clone(), 0), metrics.ledger_counters());
        let settlement = Settlement::default();
        let payer = Payer { key: "lab-a".into(), hash: Some("abcdefabcdef".into()), account: Some("proj-42".into()) };
        let asked = Asked {
            model: "m".into(),
            endpoint: "/v1/chat/completions".into(),
            stream: true,
            arrived: SystemTime::now(),
            started: Instant::now(),
        };
        let charge = Charge::new(metrics.clone(), Some(ledger.clone()), Some(payer), asked, Some(settlement.clone()));
        let usage = crate::body::EngineUsage { prompt_tokens: 7, completion_tokens: 5, total_tokens: 12 };
        let ending = Ending { how: BodyEnd::Complete, usage: Some(usage), first_byte: Some(Instant::now()) };
        charge.clone().ended("node1", 200, &ending);
        charge.refused(503);
        ledger.close();
        let text = metrics.encode();
        assert!(text.contains(r#"tela_gateway_key_requests_total{key="lab-a"} 1"#), "{text}");
        assert!(text.contains(r#"tela_gateway_key_tokens_total{key="lab-a",kind="prompt"} 7"#), "{text}");
        assert!(text.contains(r#"tela_gateway_model_tokens_total{model="m",kind="completion"} 5"#), "{text}");
        let conn = crate::db::open_read_only(&path, 1).expect("opens");
        let got: (String, String, String, i64, String, i64, i64, bool) = conn
            .query_row(
                "SELECT key_name, key_hash, account, status, outcome, prompt_tokens, completion_tokens, ttft_ms IS NOT NULL FROM requests",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?, r.get(7)?)),
            )
            .expect("one row");
        assert_eq!(got, ("lab-a".into(), "abcdefabcdef".into(), "proj-42".into(), 200, "complete".into(), 7, 5, true));
    }

    #[test]
    fn key_hashes_are_the_start_of_the_key_file_line() {
        let line = crate::auth::key_line("secret-key");
        let want = line["sha256:".len().."sha256:".len() + 12].to_string();
        assert_eq!(key_hash(Some(b"Bearer secret-key"), None), Some(want.clone()));
        assert_eq!(key_hash(None, Some(b" secret-key ")), Some(want));
        assert_eq!(key_hash(Some(b"Basic abc"), None), None);
        assert_eq!(key_hash(None, None), None);
    }
}
