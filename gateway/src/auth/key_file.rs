//! The watched key file: loaded at start and swapped in whole whenever it changes, keeping the
//! previous keys when the new file is unusable.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tela_runtime::snapshot::SnapshotCell;
use tokio_util::task::AbortOnDropHandle;

use super::access::Access;
use super::key_set::{KeyFileError, KeySet};

/// How often the key file is checked for changes.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(1);

/// A key file being watched; stops watching when dropped.
pub struct KeyFile {
    keys: Arc<SnapshotCell<KeySet>>,
    _watch: AbortOnDropHandle<()>,
}

impl KeyFile {
    /// Loads `path` (failing if it is unusable now) and reloads it whenever it changes.
    pub fn watch(path: PathBuf) -> Result<KeyFile, KeyFileError> {
        let initial = KeySet::load(&path)?;
        tracing::info!("{} API key(s) from {}", initial.len(), path.display());
        let keys = Arc::new(SnapshotCell::new(initial));
        let cell = keys.clone();
        let task = tokio::spawn(async move {
            let mut seen = stamp(&path);
            loop {
                tokio::time::sleep(RELOAD_INTERVAL).await;
                let now = stamp(&path);
                if now == seen {
                    continue;
                }
                seen = now;
                match KeySet::load(&path) {
                    Ok(mut set) => {
                        let kept = set.keep_counters(&cell.load());
                        tracing::info!(
                            "reloaded {}: {} API key(s), {kept} of them unchanged keys that keep their counters",
                            path.display(),
                            set.len()
                        );
                        cell.store(Arc::new(set));
                    }
                    Err(e) => tracing::error!("{e}; keeping the previous keys"),
                }
            }
        });
        Ok(KeyFile { keys, _watch: AbortOnDropHandle::new(task) })
    }

    /// The access rule backed by this file.
    pub fn access(&self) -> Access {
        Access::Keys(self.keys.clone())
    }
}

fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}
