//! The [`BatchSystem`] a plan's `[spin.backend]` names.

use std::sync::Arc;

use tela_runtime::batch::{BatchError, BatchFuture, BatchJob, BatchJobId, BatchSystem, JobRequest, JobSignal};

use super::config::BackendPlan;

/// The backend for `plan`.
pub fn connect(plan: &BackendPlan) -> Result<Arc<dyn BatchSystem>, String> {
    Ok(Arc::new(Unavailable { name: plan.to_string() }))
}

/// A backend this build cannot drive: every call fails, so requests wait and time out with the
/// reason in the logs and in `/status`.
struct Unavailable {
    name: String,
}

impl Unavailable {
    fn fail<'a, T: Send + 'a>(&self) -> BatchFuture<'a, T> {
        let detail = format!("{} is not available in this build of tela", self.name);
        Box::pin(async move { Err(BatchError::Unreachable { backend: "unavailable", detail }) })
    }
}

impl BatchSystem for Unavailable {
    fn name(&self) -> &str {
        &self.name
    }

    fn submit<'a>(&'a self, _job: &'a JobRequest) -> BatchFuture<'a, BatchJobId> {
        self.fail()
    }

    fn jobs<'a>(&'a self, _ids: &'a [BatchJobId]) -> BatchFuture<'a, Vec<BatchJob>> {
        self.fail()
    }

    fn cancel(&self, _id: BatchJobId) -> BatchFuture<'_, ()> {
        self.fail()
    }

    fn signal(&self, _id: BatchJobId, _signal: JobSignal) -> BatchFuture<'_, ()> {
        self.fail()
    }
}
