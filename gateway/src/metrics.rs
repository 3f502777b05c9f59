//! The gateway's Prometheus metrics (`GET /metrics`, text exposition format), kept with the
//! `prometheus-client` crate:
//!
//! | metric | labels | what |
//! |---|---|---|
//! | `tela_gateway_requests_total` | `model`, `status` | API requests answered, by the status sent |
//! | `tela_gateway_request_duration_seconds` | `model`, `stream` | request arrival to the last byte of the response |
//! | `tela_gateway_added_seconds` | | the gateway's own time: arrival to the request written into a tunnel |
//! | `tela_gateway_routing_seconds` | | one routing decision |
//! | `tela_gateway_retries_total` | `reason` | attempts repeated on another node before the first response byte |
//! | `tela_gateway_broken_streams_total` | | responses that broke after their first byte |
//! | `tela_gateway_in_flight` | `node` | requests in flight per node, as this gateway counts them |
//! | `tela_gateway_nodes` | `state` | nodes in the registry by lifecycle state (at scrape time) |
//! | `tela_gateway_spin_submits_total` | `model` | batch jobs submitted to start a replica |
//! | `tela_gateway_spin_cancels_total` | `model` | jobs cancelled before they served |
//! | `tela_gateway_spin_drains_total` | `model` | serving nodes of the gateway's jobs told to drain |
//! | `tela_gateway_spin_batch_errors_total` | `op` | failed batch-system calls (`submit`, `jobs`, `cancel`, `drain`) |
//! | `tela_gateway_cold_start_queued` | `model` | requests waiting for a replica |
//! | `tela_gateway_cold_start_wait_seconds` | `outcome` | how long requests waited (`ready`, `timeout`) |
//! | `tela_gateway_key_refusals_total` | `key`, `limit` | requests a key's limit refused with 429 ([`crate::limits`]; `fair_queue`: its queue on a saturated model was full or waited too long, [`crate::fairness`]) |
//! | `tela_gateway_key_requests_total` | `key` | inference requests per key, answered by a node or refused |
//! | `tela_gateway_key_tokens_total` | `key`, `kind` | tokens the engines reported per key (`prompt`, `completion`) |
//! | `tela_gateway_model_tokens_total` | `model`, `kind` | tokens the engines reported per model |
//! | `tela_gateway_ledger_rows_total` | | rows written to the usage ledger ([`crate::ledger`]) |
//! | `tela_gateway_ledger_dropped_rows_total` | | ledger rows lost: the writer was too far behind, or the database unwritable for too long |
//! | `tela_gateway_ledger_errors_total` | | failed opens, writes and deletes of the ledger's database |
//!
//! Model labels only carry names some node serves (others are counted as `unknown`), and key
//! labels only names from the key file, so a client cannot grow the label set without bound.

use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// `model` and `status`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The model asked for (or `unknown`, `-` where none applies).
    pub model: String,
    /// The HTTP status sent.
    pub status: u16,
}

/// `model` and `stream`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DurationLabels {
    /// The model.
    pub model: String,
    /// Whether the response was a stream.
    pub stream: bool,
}

/// `node`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabel {
    /// The node's short id.
    pub node: String,
}

/// `reason`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// Why the attempt was repeated.
    pub reason: String,
}

/// `model`, for spinnable models (names from the configuration only).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabel {
    /// The model.
    pub model: String,
}

/// `op`: a batch-system call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabel {
    /// `submit`, `jobs`, `cancel` or `drain`.
    pub op: String,
}

/// `outcome` of a cold-start wait.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// `ready` or `timeout`.
    pub outcome: String,
}

/// `key` and `limit`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KeyLimitLabels {
    /// The key's name in the key file.
    pub key: String,
    /// `requests`, `tokens`, `concurrent`, `budget` or `too_large`.
    pub limit: String,
}

/// `key`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KeyLabel {
    /// The key's name in the key file.
    pub key: String,
}

/// `key` and `kind` of tokens.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KeyTokenLabels {
    /// The key's name in the key file.
    pub key: String,
    /// `prompt` or `completion`.
    pub kind: String,
}

/// `model` and `kind` of tokens.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelTokenLabels {
    /// The model.
    pub model: String,
    /// `prompt` or `completion`.
    pub kind: String,
}

/// `state`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    /// A lifecycle state.
    pub state: String,
}

/// Every metric the gateway keeps.
pub struct Metrics {
    registry: Mutex<Registry>,
    /// Requests by model and status.
    pub requests: Family<RequestLabels, Counter>,
    /// End-to-end duration.
    pub duration: Family<DurationLabels, Histogram>,
    /// The gateway's own added time.
    pub added: Histogram,
    /// Routing decision time.
    pub routing: Histogram,
    /// Retries by reason.
    pub retries: Family<ReasonLabel, Counter>,
    /// Responses broken after the first byte.
    pub broken: Counter,
    /// In flight per node.
    pub in_flight: Family<NodeLabel, Gauge>,
    /// Nodes by state.
    pub nodes: Family<StateLabel, Gauge>,
    /// Jobs submitted by the spinner.
    pub spin_submits: Family<ModelLabel, Counter>,
    /// Jobs cancelled by the spinner.
    pub spin_cancels: Family<ModelLabel, Counter>,
    /// Nodes drained by the spinner.
    pub spin_drains: Family<ModelLabel, Counter>,
    /// Failed batch-system calls.
    pub spin_batch_errors: Family<OpLabel, Counter>,
    /// Requests waiting for a replica.
    pub cold_start_queued: Family<ModelLabel, Gauge>,
    /// Cold-start waits.
    pub cold_start_wait: Family<OutcomeLabel, Histogram>,
    /// Requests refused by a key's limits.
    pub key_refusals: Family<KeyLimitLabels, Counter>,
    /// Inference requests per key.
    pub key_requests: Family<KeyLabel, Counter>,
    /// Engine-reported tokens per key.
    pub key_tokens: Family<KeyTokenLabels, Counter>,
    /// Engine-reported tokens per model.
    pub model_tokens: Family<ModelTokenLabels, Counter>,
    /// The usage ledger's writer.
    pub ledger: crate::ledger::LedgerCounters,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// A fresh set, registered.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("tela_gateway");
        let requests = Family::<RequestLabels, Counter>::default();
        let duration = Family::<DurationLabels, Histogram>::new_with_constructor(
            (|| Histogram::new(exponential_buckets(0.001, 2.0, 18))) as fn() -> Histogram,
        );
        let added = Histogram::new(exponential_buckets(0.000_05, 2.0, 16));
        let routing = Histogram::new(exponential_buckets(0.000_001, 2.0, 16));
        let retries = Family::<ReasonLabel, Counter>::default();
        let broken = Counter::default();
        let in_flight = Family::<NodeLabel, Gauge>::default();
        let nodes = Family::<StateLabel, Gauge>::default();
        registry.register("requests", "API requests answered, by model and status", requests.clone());
        registry.register(
            "request_duration_seconds",
            "From a request's arrival to the last byte of its response",
            duration.clone(),
        );
        registry.register(
            "added_seconds",
            "The gateway's own time per request: arrival to the request written into a node's tunnel",
            added.clone(),
        );
        registry.register("routing_seconds", "Time of one routing decision", routing.clone());
        registry.register(
            "retries",
            "Attempts repeated on another node before the first response byte",
            retries.clone(),
        );
        registry.register("broken_streams", "Responses that broke after their first byte", broken.clone());
        registry.register("in_flight", "Requests in flight per node, as this gateway counts them", in_flight.clone());
        registry.register("nodes", "Nodes in this gateway's registry replica, by lifecycle state", nodes.clone());
        let spin_submits = Family::<ModelLabel, Counter>::default();
        let spin_cancels = Family::<ModelLabel, Counter>::default();
        let spin_drains = Family::<ModelLabel, Counter>::default();
        let spin_batch_errors = Family::<OpLabel, Counter>::default();
        let cold_start_queued = Family::<ModelLabel, Gauge>::default();
        let cold_start_wait = Family::<OutcomeLabel, Histogram>::new_with_constructor(
            (|| Histogram::new(exponential_buckets(0.1, 2.0, 14))) as fn() -> Histogram,
        );
        registry.register("spin_submits", "Batch jobs submitted to start a replica", spin_submits.clone());
        registry.register("spin_cancels", "Jobs cancelled before they served", spin_cancels.clone());
        registry.register("spin_drains", "Serving nodes of the gateway's jobs told to drain", spin_drains.clone());
        registry.register("spin_batch_errors", "Failed batch-system calls, by operation", spin_batch_errors.clone());
        registry.register(
            "cold_start_queued",
            "Requests waiting for a replica of their model",
            cold_start_queued.clone(),
        );
        registry.register(
            "cold_start_wait_seconds",
            "How long requests waited for a replica, by outcome",
            cold_start_wait.clone(),
        );
        let key_refusals = Family::<KeyLimitLabels, Counter>::default();
        registry.register(
            "key_refusals",
            "Requests refused by their key's limits, by key and limit",
            key_refusals.clone(),
        );
        let key_requests = Family::<KeyLabel, Counter>::default();
        let key_tokens = Family::<KeyTokenLabels, Counter>::default();
        let model_tokens = Family::<ModelTokenLabels, Counter>::default();
        registry.register(
            "key_requests",
            "Inference requests per key, answered by a node or refused",
            key_requests.clone(),
        );
        registry.register("key_tokens", "Tokens the engines reported per key, by kind", key_tokens.clone());
        registry.register("model_tokens", "Tokens the engines reported per model, by kind", model_tokens.clone());
        let ledger = crate::ledger::LedgerCounters::default();
        registry.register("ledger_rows", "Rows written to the usage ledger", ledger.written.clone());
        registry.register(
            "ledger_dropped_rows",
            "Usage ledger rows lost: the writer was too far behind or the database unwritable for too long",
            ledger.dropped.clone(),
        );
        registry.register(
            "ledger_errors",
            "Failed opens, writes and deletes of the usage ledger's database",
            ledger.errors.clone(),
        );
        Metrics {
            registry: Mutex::new(registry),
            requests,
            duration,
            added,
            routing,
            retries,
            broken,
            in_flight,
            nodes,
            spin_submits,
            spin_cancels,
            spin_drains,
            spin_batch_errors,
            cold_start_queued,
            cold_start_wait,
            key_refusals,
            key_requests,
            key_tokens,
            model_tokens,
            ledger,
        }
    }

    /// The usage ledger's counters, to hand to its writer.
    pub fn ledger_counters(&self) -> crate::ledger::LedgerCounters {
        self.ledger.clone()
    }

    /// Counts one answered request.
    pub fn count(&self, model: &str, status: u16) {
        self.requests.get_or_create(&RequestLabels { model: model.to_string(), status }).inc();
    }

    /// The text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        out
    }
}
