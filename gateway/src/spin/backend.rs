//! The [`BatchSystem`] a plan's `[spin.backend]` names: the Slurm commands
//! ([`tela_runtime::batch::sbatch`]), slurmrestd ([`tela_runtime::batch::slurmrest`]) or
//! FirecREST v2 ([`tela_runtime::batch::firecrest`]).

use std::sync::Arc;

use tela_runtime::batch::firecrest::{Firecrest, FirecrestConfig};
use tela_runtime::batch::sbatch::{Sbatch, SbatchConfig};
use tela_runtime::batch::slurmrest::{RestVersion, SlurmRest, SlurmRestConfig};
use tela_runtime::batch::BatchSystem;

use super::config::BackendPlan;

/// The backend for `plan`.
pub fn connect(plan: &BackendPlan) -> Result<Arc<dyn BatchSystem>, String> {
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
            let version: RestVersion =
                version.parse().map_err(|e: tela_runtime::batch::slurmrest::UnknownRestVersion| e.to_string())?;
            let mut config = SlurmRestConfig::new(url.clone(), user.clone(), token_file.clone());
            config.timeout = *timeout;
            config.version = Some(version);
            config.ca_cert = ca_cert.clone();
            Ok(Arc::new(SlurmRest::with_version(config, version).map_err(|e| e.to_string())?))
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
            Ok(Arc::new(Firecrest::new(config).map_err(|e| e.to_string())?))
        }
    }
}
