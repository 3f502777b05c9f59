//! [`report_load`]: the task that reads the engine's own load and pushes it to the gateways.
//!
//! Every [`LoadConfig::interval`] (500 ms by default; at most a second, so that a gateway's
//! view is never more than about a second behind) it fetches the engine's `/metrics` and reads
//! running and waiting requests and KV-cache usage per model ([`super::metrics`]). The result
//! goes out as a [`LoadReport`] datagram ([`crate::load_report`]) on this node's connection to
//! each gateway — when it changed, and otherwise once per [`LoadConfig::refresh`] so that
//! gateways can tell a quiet engine from a silent node. A report is a few dozen bytes.
//!
//! Between reads, a tunnelled request that starts or ends here is reported at once (at most one
//! report per [`MIN_GAP`]), with the last reading moved by the change in this node's in-flight
//! count since that reading: the engine counts one more or one fewer. Without it, a request
//! that just ended through one gateway would still count for half a second at another — long
//! enough to push a conversation's next turn, sent there at once, off its node. The change is
//! taken from the first model listed (the node does not know which model a request was for);
//! the engine's total, which routing uses, is what it is about.
//!
//! A node whose walltime is near hands over: from [`LoadConfig::handover_window`] before its
//! drain starts, every report says how long until then ([`LoadReport::leaving_in_ms`]), and the
//! gateways send its conversations to the nodes they will stay on. The first such report goes
//! out at the next tick, and one goes out at least every [`LoadConfig::refresh`] from then on —
//! with no engine load in it if the engine has no metrics to read.
//!
//! Every report says how many requests the engine runs at once when the node was told
//! ([`LoadConfig::slots`], `--engine-slots`), so gateways can send a conversation to an engine
//! with a free slot rather than queue it behind another.
//!
//! An engine without usable metrics — `/metrics` answers 404, 405, 410 or 501 (the llama.cpp
//! server without `--metrics`, SGLang without `--enable-metrics`, llama-cpp-python), or a page
//! with none of the gauges this node reads (TGI, a plain OpenAI proxy) — is said once in the
//! log, and asked again only every [`LoadConfig::retry_unsupported`]. Meanwhile, if its slots
//! are known, the node reports its own count of requests in flight to it instead (as many
//! running as it has slots, the rest waiting: every request to the engine goes through this
//! node), at once on each change and at least every [`LoadConfig::refresh`]; if they are not,
//! it gets no load in its reports (and no reports at all unless it hands over), and gateways
//! route it on their own in-flight counts. A failed fetch (the engine restarting, a timeout)
//! sends nothing and is tried again at the next tick; the gateways' reports age out meanwhile.

use std::time::Duration;

use http::StatusCode;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::metrics::parse_engine_metrics;
use super::Backend;
use crate::load_report::{encode, LoadReport, ModelLoad};
use crate::RuntimeView;

/// Reports from in-flight changes are at least this far apart (a burst is coalesced).
pub const MIN_GAP: Duration = Duration::from_millis(1);

/// Largest `/metrics` page read; vLLM's, with its histograms, is some hundreds of KB at most.
const MAX_METRICS_BODY: usize = 4 * 1024 * 1024;

/// How [`report_load`] polls and reports.
#[derive(Clone, Debug)]
pub struct LoadConfig {
    /// Time between reads of `/metrics`.
    pub interval: Duration,
    /// The longest one read may take.
    pub timeout: Duration,
    /// An unchanged load is sent again after this long.
    pub refresh: Duration,
    /// How long an engine without usable metrics is left alone before it is asked again.
    pub retry_unsupported: Duration,
    /// When the walltime starts this node's drain, if it has a walltime.
    pub drain_starts: Option<Instant>,
    /// How long before [`LoadConfig::drain_starts`] the node hands over (see the module docs).
    pub handover_window: Duration,
    /// Requests the engine runs at once, if known ([`LoadReport::slots`]).
    pub slots: Option<u32>,
}

/// The handover window when none is given: long enough for a conversation's next turn to come
/// (most come within minutes), short against a job's hours.
pub const DEFAULT_HANDOVER_WINDOW: Duration = Duration::from_secs(5 * 60);

impl Default for LoadConfig {
    fn default() -> Self {
        LoadConfig {
            interval: Duration::from_millis(500),
            timeout: Duration::from_secs(2),
            refresh: Duration::from_secs(1),
            retry_unsupported: Duration::from_secs(60),
            drain_starts: None,
            handover_window: DEFAULT_HANDOVER_WINDOW,
            slots: None,
        }
    }
}

impl LoadConfig {
    /// How long until the drain starts, once `now` is within the handover window before it
    /// (zero once it has started); `None` outside the window or without a walltime.
    pub fn leaving_in(&self, now: Instant) -> Option<Duration> {
        let starts = self.drain_starts?;
        (now + self.handover_window >= starts).then(|| starts.saturating_duration_since(now))
    }
}

/// What one read of `/metrics` found.
#[derive(Debug, PartialEq)]
enum Reading {
    /// The engine's load per model.
    Load(Vec<ModelLoad>),
    /// The engine has no metrics this node can read; why.
    Unsupported(String),
    /// No answer this time; why.
    Failed(String),
}

async fn read(backend: &Backend, timeout: Duration) -> Reading {
    let url = backend.display("/metrics");
    match backend.metrics(timeout, MAX_METRICS_BODY).await {
        Err(e) => Reading::Failed(e.to_string()),
        Ok((status, _))
            if matches!(
                status,
                StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED | StatusCode::GONE | StatusCode::NOT_IMPLEMENTED
            ) =>
        {
            Reading::Unsupported(format!("{url} answered {status}"))
        }
        Ok((status, _)) if !status.is_success() => Reading::Failed(format!("{url} answered {status}")),
        Ok((_, body)) => match parse_engine_metrics(&String::from_utf8_lossy(&body)) {
            Some(models) => Reading::Load(models),
            None => Reading::Unsupported(format!("{url} has no vLLM, SGLang or llama.cpp load gauges")),
        },
    }
}

/// Reads the engine's load and pushes it to every gateway this node is connected to, until
/// `stop` is cancelled; see the module docs.
pub async fn report_load(backend: Backend, config: LoadConfig, view: RuntimeView, stop: CancellationToken) {
    let epoch = crate::clock::generation_now();
    let mut seq = 0u64;
    // What was last sent (the models, and whether the node handed over) and when.
    let mut last: Option<Sent> = None;
    let handover = config.clone();
    let mut said_handover = false;
    let mut send = |models: Vec<ModelLoad>, last: &mut Option<Sent>| {
        seq += 1;
        let now = Instant::now();
        let leaving_in = handover.leaving_in(now);
        if let (Some(left), false) = (leaving_in, said_handover) {
            tracing::info!(
                "handing over: draining starts in {}; the gateways send new conversations to other nodes",
                humantime::format_duration(Duration::from_secs(left.as_secs()))
            );
            said_handover = true;
        }
        let leaving_in_ms = leaving_in.map(|left| u64::try_from(left.as_millis()).unwrap_or(u64::MAX));
        let slots = handover.slots;
        view.send_to_gateways(&encode(&LoadReport { epoch, seq, models: models.clone(), leaving_in_ms, slots }));
        *last = Some(Sent { models, handing_over: leaving_in_ms.is_some(), at: now });
    };
    // The last reading, the in-flight count it is taken to include, and when it was taken.
    let mut reading: Option<(Vec<ModelLoad>, u32, Instant)> = None;
    // A read under way runs beside the in-flight changes, which are reported meanwhile.
    let mut under_way = None;
    let mut unsupported_until: Option<Instant> = None;
    let mut said_unsupported = false;
    let mut tick = tokio::time::interval(config.interval);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = view.in_flight().changed_for_reports() => {
                // Only from a recent reading: moving an old one would pass it off as fresh.
                let recent = reading.as_ref().filter(|(_, _, at)| at.elapsed() < 2 * config.refresh);
                let now_load = match (recent, unsupported_until, config.slots) {
                    (Some((models, at_reading, _)), _, _) => Some(moved_by(models, view.in_flight().get(), *at_reading)),
                    (None, Some(_), Some(slots)) => Some(own_count(view.in_flight().get(), slots)),
                    _ => None,
                };
                if let Some(models) = now_load {
                    if last.as_ref().map_or(true, |sent| sent.models != models) {
                        send(models, &mut last);
                        tokio::time::sleep(MIN_GAP).await;
                    }
                }
            }
            _ = tick.tick(), if under_way.is_none() => {
                let now = Instant::now();
                if unsupported_until.map_or(true, |until| now >= until) {
                    let (backend, before) = (&backend, view.in_flight().get());
                    under_way = Some(Box::pin(async move { (read(backend, config.timeout).await, before) }));
                } else if let Some(slots) = config.slots {
                    // No metrics, but every request goes through this node: its own count.
                    let models = own_count(view.in_flight().get(), slots);
                    if last.as_ref().map_or(true, |sent| sent.models != models || sent.due(now, &config)) {
                        send(models, &mut last);
                    }
                } else if config.leaving_in(now).is_some() && last.as_ref().map_or(true, |sent| sent.due(now, &config)) {
                    // No load to tell, but the gateways must hear that this node hands over.
                    send(Vec::new(), &mut last);
                }
            }
            (got, before) = async { under_way.as_mut().expect("guarded").await }, if under_way.is_some() => {
                under_way = None;
                match got {
                    Reading::Load(models) => {
                        // A request that started or ended during the read may or may not be in
                        // it: take it as included (the higher count), so that an ended request
                        // never lingers in a report — an underestimate lasts one read at most.
                        let after = view.in_flight().get();
                        let at_reading = before.max(after);
                        let moved = moved_by(&models, after, at_reading);
                        reading = Some((models, at_reading, Instant::now()));
                        if said_unsupported {
                            tracing::info!("the engine at {} now reports its load; sending it to the gateways", backend.url());
                            said_unsupported = false;
                        }
                        unsupported_until = None;
                        let due = match &last {
                            Some(sent) => sent.models != moved || sent.due(Instant::now(), &config),
                            None => true,
                        };
                        if due {
                            send(moved, &mut last);
                        }
                    }
                    Reading::Unsupported(why) => {
                        if !said_unsupported {
                            let instead = match config.slots {
                                Some(slots) => format!("reporting this node's own count of requests in flight against the engine's {slots} slot(s) instead"),
                                None => "no load reports from this node; gateways route it by their own in-flight counts".into(),
                            };
                            tracing::info!(
                                "{why}: {instead} (asking again every {})",
                                humantime::format_duration(config.retry_unsupported)
                            );
                            said_unsupported = true;
                        }
                        unsupported_until = Some(Instant::now() + config.retry_unsupported);
                        last = None;
                        reading = None;
                        if let Some(slots) = config.slots {
                            send(own_count(view.in_flight().get(), slots), &mut last);
                        }
                    }
                    Reading::Failed(why) => tracing::debug!("no load report this time: {why}"),
                }
            }
        }
    }
}

/// A report as sent.
struct Sent {
    models: Vec<ModelLoad>,
    handing_over: bool,
    at: Instant,
}

impl Sent {
    /// Whether a report with the same load is due again at `now`: the refresh has come, or the
    /// node started handing over since.
    fn due(&self, now: Instant, config: &LoadConfig) -> bool {
        // Half a tick early: ticks are not exact, and a refresh that just missed one would
        // otherwise wait for the next, half again as long.
        let refresh = config.refresh.saturating_sub(config.interval / 2);
        now.saturating_duration_since(self.at) >= refresh || self.handing_over != config.leaving_in(now).is_some()
    }
}

/// The load of an engine without metrics, from this node's `in_flight` requests to it: as many
/// running as it has `slots`, the rest waiting, under no model name (the whole engine).
fn own_count(in_flight: u32, slots: u32) -> Vec<ModelLoad> {
    let running = in_flight.min(slots);
    vec![ModelLoad { model: String::new(), running, waiting: in_flight - running, kv_permille: None }]
}

/// `models` as read when this node had `at_reading` tunnelled requests in flight, moved to
/// `now` in flight: each started request counts as running, each ended one leaves (waiting
/// requests first, then running ones).
fn moved_by(models: &[ModelLoad], now: u32, at_reading: u32) -> Vec<ModelLoad> {
    let mut moved = models.to_vec();
    if now >= at_reading {
        if let Some(first) = moved.first_mut() {
            first.running = first.running.saturating_add(now - at_reading);
        }
        return moved;
    }
    let mut ended = at_reading - now;
    for m in &mut moved {
        for count in [&mut m.waiting, &mut m.running] {
            let take = ended.min(*count);
            *count -= take;
            ended -= take;
        }
    }
    moved
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// An HTTP server that answers every request with `status` and `body`.
    async fn answering(status: &'static str, body: &'static str) -> Backend {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = s.read(&mut buf).await;
                    let reply = format!(
                        "HTTP/1.1 {status}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = s.write_all(reply.as_bytes()).await;
                });
            }
        });
        Backend::new(&format!("http://{addr}")).expect("backend")
    }

    #[test]
    fn readings_move_with_the_in_flight_count() {
        let m = |model: &str, running, waiting| ModelLoad { model: model.into(), running, waiting, kv_permille: None };
        let read = vec![m("a", 2, 1), m("b", 1, 0)];
        assert_eq!(moved_by(&read, 3, 3), read);
        assert_eq!(moved_by(&read, 5, 3), vec![m("a", 4, 1), m("b", 1, 0)]);
        assert_eq!(moved_by(&read, 1, 3), vec![m("a", 1, 0), m("b", 1, 0)]);
        assert_eq!(moved_by(&read, 0, 9), vec![m("a", 0, 0), m("b", 0, 0)], "never below zero");
        assert_eq!(moved_by(&[], 4, 0), vec![]);
    }

    #[test]
    fn without_metrics_the_own_count_fills_the_slots_then_waits() {
        let m = |running, waiting| vec![ModelLoad { model: String::new(), running, waiting, kv_permille: None }];
        assert_eq!(own_count(0, 1), m(0, 0));
        assert_eq!(own_count(1, 1), m(1, 0));
        assert_eq!(own_count(3, 1), m(1, 2));
        assert_eq!(own_count(3, 4), m(3, 0));
    }

    #[test]
    fn the_handover_window_opens_before_the_drain_starts() {
        let now = Instant::now();
        let window = Duration::from_secs(300);
        let config = |starts: Option<Instant>| LoadConfig { drain_starts: starts, ..LoadConfig::default() };
        assert_eq!(LoadConfig::default().handover_window, window);
        assert_eq!(config(None).leaving_in(now), None, "no walltime, no handover");
        assert_eq!(config(Some(now + window + Duration::from_secs(1))).leaving_in(now), None, "not yet");
        assert_eq!(config(Some(now + window)).leaving_in(now), Some(window), "the window opens");
        assert_eq!(config(Some(now + Duration::from_secs(4))).leaving_in(now), Some(Duration::from_secs(4)));
        assert_eq!(config(Some(now)).leaving_in(now + Duration::from_secs(9)), Some(Duration::ZERO), "draining");
        let sent = Sent { models: vec![], handing_over: false, at: now };
        let soon = config(Some(now + window + Duration::from_millis(100)));
        assert!(!sent.due(now, &soon), "nothing new: the refresh is a second away");
        assert!(sent.due(now + Duration::from_millis(100), &soon), "the handover begins: due at once");
    }

    #[tokio::test]
    async fn readings_tell_load_from_no_metrics_from_failures() {
        let t = Duration::from_secs(2);
        let vllm = answering("200 OK", "vllm:num_requests_running{model_name=\"m\"} 2\n").await;
        assert_eq!(
            read(&vllm, t).await,
            Reading::Load(vec![ModelLoad { model: "m".into(), running: 2, waiting: 0, kv_permille: None }])
        );
        for (status, body) in
            [("404 Not Found", "not found"), ("501 Not Implemented", "{\"error\":{}}"), ("200 OK", "<html>")]
        {
            let r = read(&answering(status, body).await, t).await;
            assert!(matches!(&r, Reading::Unsupported(why) if why.contains("/metrics")), "{status}: {r:?}");
        }
        assert!(matches!(read(&answering("503 Service Unavailable", "").await, t).await, Reading::Failed(_)));
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").port();
        let nothing = Backend::new(&format!("http://127.0.0.1:{port}")).expect("backend");
        assert!(matches!(read(&nothing, t).await, Reading::Failed(_)));
    }
}
