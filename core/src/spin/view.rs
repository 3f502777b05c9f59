//! What the spinner sees and what it asks for: the [`SpinView`] a runtime builds for each
//! decision (demand per model, the registry's replicas, the spinner's jobs, free hardware) and
//! the [`SpinCommand`]s it gets back.

use crate::id::NodeId;
use crate::placement::{NodeShape, Placement};
use crate::record::Lifecycle;
use crate::replica::Replica;
use core::time::Duration;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A job the spinner submitted, numbered by the spinner; the runtime maps it to the batch
/// system's own id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct JobId(pub u64);

/// Demand for one model, as the gateway measures it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Demand {
    /// Requests waiting for a replica (the cold-start queue and any gateway queue).
    pub queued: u32,
    /// Requests being served now.
    pub in_flight: u32,
    /// Requests that arrived over the last minute.
    pub arrivals_per_min: u32,
    /// 95th percentile of time to first byte over the runtime's window, if measured.
    pub p95_latency: Option<Duration>,
    /// Replicas a backlog of low-priority work (the gateway's batch API) justifies beyond the
    /// requests above, as the runtime sized and capped it. Low priority: it is granted after
    /// every interactive shortfall, and jobs submitted only for it are marked
    /// [`SpinCommand::Submit::batch`] and use [`ModelPolicy::batch_walltime`](super::ModelPolicy::batch_walltime).
    pub batch_replicas: u32,
}

impl Demand {
    /// Whether nothing is waiting, running or arriving.
    pub fn is_idle(&self) -> bool {
        self.queued == 0 && self.in_flight == 0 && self.arrivals_per_min == 0 && self.batch_replicas == 0
    }
}

/// Where a job stands in the batch system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum JobState {
    /// Being submitted or waiting in the batch queue.
    Queued,
    /// Running; `node` is the serving node it started, once known.
    Running {
        /// The node the job started, once it joined.
        node: Option<NodeId>,
    },
}

/// One of the spinner's jobs that the batch system still lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct JobStatus {
    /// The job.
    pub job: JobId,
    /// Its state.
    pub state: JobState,
}

impl JobStatus {
    /// A job waiting in the queue.
    pub fn queued(job: JobId) -> JobStatus {
        JobStatus { job, state: JobState::Queued }
    }

    /// A running job that became `node` (if known).
    pub fn running(job: JobId, node: Option<NodeId>) -> JobStatus {
        JobStatus { job, state: JobState::Running { node } }
    }
}

/// A registry node hosting a model, as the spinner needs to see it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ReplicaStatus {
    /// The node.
    pub node: NodeId,
    /// The model it hosts (one entry per model for nodes hosting several).
    pub model: String,
    /// Its lifecycle state.
    pub lifecycle: Lifecycle,
    /// Requests in flight on it for this model, as the gateway counts them.
    pub in_flight: u32,
}

/// Everything the spinner looks at in one decision.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SpinView {
    /// Demand per model; a model absent here has none.
    pub demand: BTreeMap<String, Demand>,
    /// Registry nodes hosting spinnable models.
    pub replicas: Vec<ReplicaStatus>,
    /// The spinner's jobs the batch system still lists (see the [`spin`](super) module docs for the contract).
    pub jobs: Vec<JobStatus>,
    /// Hardware the spinner may ask for now.
    pub shapes: Vec<NodeShape>,
}

impl SpinView {
    /// Adds the replicas of spinnable models that `replica` holds, as node `local` sees them:
    /// one entry per node and spinnable model, `local` itself left out, and a node `local` no
    /// longer hears from (not alive in its replica) held DOWN whatever its record says, since it
    /// is no supply. `in_flight` gives a node's requests in flight as the caller counts them.
    /// The gateway's spinner and the simulator both build their view's replicas here.
    pub fn add_replicas(
        &mut self,
        replica: &Replica,
        local: NodeId,
        spinnable: impl Fn(&str) -> bool,
        in_flight: impl Fn(&NodeId) -> u32,
    ) {
        for slot in replica.slots() {
            let r = slot.record();
            if r.id == local {
                continue;
            }
            let lifecycle = if !slot.is_alive() && r.state < Lifecycle::Down { Lifecycle::Down } else { r.state };
            for model in r.models.as_slice().iter().filter(|m| spinnable(&m.name)) {
                self.replicas.push(ReplicaStatus {
                    node: r.id,
                    model: model.name.clone(),
                    lifecycle,
                    in_flight: in_flight(&r.id),
                });
            }
        }
    }
}

/// What the runtime should do.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SpinCommand {
    /// Submit a batch job that starts a serving node for `model`.
    Submit {
        /// The spinner's id for the job.
        job: JobId,
        /// The model to serve.
        model: String,
        /// Where and how (shape, tensor parallelism, nodes, checkpoint).
        placement: Placement,
        /// The job's time limit; the node drains before it.
        walltime: Duration,
        /// Submitted for low-priority backlog only ([`Demand::batch_replicas`]): a short,
        /// backfill-friendly job.
        batch: bool,
    },
    /// Cancel a job that is not serving yet.
    Cancel {
        /// The job.
        job: JobId,
    },
    /// Drain a serving node: no new requests, in-flight ones finish, then the job exits.
    Drain {
        /// The node.
        node: NodeId,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::Hardware;
    use crate::time::Time;

    #[test]
    fn the_view_holds_spinnable_replicas_and_a_node_not_heard_from_is_down() {
        use crate::record::{Model, ModelSet, Reachability, Record, Role};
        use std::sync::Arc;
        let record = |n: u64, state: Lifecycle, models: &[&str]| {
            let mut r = Record::new(NodeId::from_u64(n), 1, Role::Serving, Hardware::CPU, Reachability::OutboundOnly);
            r.state = state;
            r.models = ModelSet::from_models(models.iter().map(|m| Model::named(*m)).collect());
            Arc::new(r)
        };
        let gateway = NodeId::from_u64(0);
        let mut replica = Replica::new((*record(0, Lifecycle::Serve, &["spun"])).clone(), Time::ZERO);
        replica.merge(Time::ZERO, record(1, Lifecycle::Serve, &["spun", "fixed"]));
        replica.merge(Time::ZERO, record(2, Lifecycle::Serve, &["spun"]));
        replica.merge(Time::ZERO, record(3, Lifecycle::Join, &["spun"]));
        replica.merge(Time::ZERO, record(4, Lifecycle::Serve, &["fixed"]));
        replica.set_alive(&NodeId::from_u64(2), false);
        let mut view = SpinView::default();
        view.add_replicas(&replica, gateway, |m| m == "spun", |id| if *id == NodeId::from_u64(1) { 3 } else { 0 });
        let mut got: Vec<(u64, &str, Lifecycle, u32)> = view
            .replicas
            .iter()
            .map(|r| {
                let n = (1..5).find(|&n| NodeId::from_u64(n) == r.node).expect("a known node");
                (n, r.model.as_str(), r.lifecycle, r.in_flight)
            })
            .collect();
        got.sort();
        assert_eq!(
            got,
            [
                (1, "spun", Lifecycle::Serve, 3),
                // Not heard from: no supply, whatever its record says.
                (2, "spun", Lifecycle::Down, 0),
                (3, "spun", Lifecycle::Join, 0),
            ]
        );
    }
}
