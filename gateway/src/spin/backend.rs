//! The [`BatchSystem`] a plan's `[spin.backend]` names: the Slurm commands
//! ([`tela_batch::sbatch`]), slurmrestd ([`tela_batch::slurmrest`]) or
//! FirecREST v2 ([`tela_batch::firecrest`]).

use std::sync::Arc;

use tela_batch::firecrest::{Firecrest, FirecrestConfig};
use tela_batch::sbatch::{Sbatch, SbatchConfig};
use tela_batch::slurmrest::{RestVersion, SlurmRest, SlurmRestConfig, UnknownRestVersion};
use tela_batch::{BatchError, BatchSystem};

use super::config::BackendPlan;

/// Why the backend a plan names cannot be set up. Nothing was submitted or contacted.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// `[spin.backend] version` names a slurmrestd version Tela does not speak.
    #[error(transparent)]
    RestVersion(#[from] UnknownRestVersion),
    /// The slurmrestd client could not be built (its token file, its CA, its URL).
    #[error(transparent)]
    Slurmrest(BatchError),
    /// The FirecREST client could not be built (its credentials, its CA, its URL).
    #[error(transparent)]
    Firecrest(BatchError),
}

/// The backend for `plan`.
pub fn connect(plan: &BackendPlan) -> Result<Arc<dyn BatchSystem>, BackendError> {
    match plan {
        BackendPlan::Sbatch { sbatch, squeue, scancel, sbatch_args, query_args, timeout } => {
            Ok(Arc::new(Sbatch::new(SbatchConfig {
                sbatch: sbatch.clone(),
                squeue: squeue.clone(),
                scancel: scancel.clone(),
                sbatch_args: sbatch_args.clone(),
                query_args: query_args.clone(),
                timeout: *timeout,
                ..SbatchConfig::default()
            })))
        }
        BackendPlan::Slurmrest { url, user, token_file, version, timeout, ca_cert } => {
            let version: RestVersion = version.parse()?;
            let mut config = SlurmRestConfig::new(url.clone(), user.clone(), token_file.clone());
            config.timeout = *timeout;
            config.version = Some(version);
            config.ca_cert = ca_cert.clone();
            Ok(Arc::new(SlurmRest::with_version(config, version).map_err(BackendError::Slurmrest)?))
        }
        BackendPlan::Firecrest { url, system, token_url, client_id, client_secret, timeout, ca_cert } => {
            let mut config = FirecrestConfig::new(
                url.clone(),
                system.clone(),
                token_url.clone(),
                client_id.clone(),
                client_secret.clone(),
            );
            config.timeout = *timeout;
            config.ca_cert = ca_cert.clone();
            Ok(Arc::new(Firecrest::new(config).map_err(BackendError::Firecrest)?))
        }
    }
}
