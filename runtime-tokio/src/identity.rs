//! Where a process's identity key and the federation's join secret come from.

use std::path::{Path, PathBuf};
use tela_transports::{Identity, IdentityError, JoinSecret};

/// Loads the identity at `path`, or at `<config dir>/tela/<default_file>` when none is given,
/// creating it on first use. Different roles on one machine default to different files so
/// that a node and an anchor started by the same user do not share an id.
pub fn load_identity(path: Option<&Path>, default_file: &str) -> Result<Identity, IdentityError> {
    let path = match path {
        Some(p) => p.to_path_buf(),
        None => default_identity_path(default_file)?,
    };
    let identity = Identity::load_or_create(&path)?;
    tracing::info!(
        node = %identity.node_id(),
        "identity {} from {}",
        identity.node_id(),
        path.display()
    );
    Ok(identity)
}

/// `<config dir>/tela/<file>`.
pub fn default_identity_path(file: &str) -> Result<PathBuf, IdentityError> {
    let default = Identity::default_path()?;
    Ok(default.with_file_name(file))
}

/// The join secret is missing or unusable.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// Neither a secret nor a secret file was given.
    #[error("no join secret: set --join-secret, TELA_JOIN_SECRET or --join-secret-file to the federation's secret")]
    Missing,
    /// Both were given.
    #[error("both --join-secret and --join-secret-file are set; keep one")]
    Both,
    /// The file could not be read.
    #[error("cannot read the join secret file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The secret is empty.
    #[error("the join secret is empty — set --join-secret / TELA_JOIN_SECRET to the federation's secret")]
    Empty,
}

/// The secret from `secret` or the first line of `file`.
pub fn read_secret(secret: Option<&str>, file: Option<&Path>) -> Result<JoinSecret, SecretError> {
    let text = match (secret, file) {
        (Some(_), Some(_)) => return Err(SecretError::Both),
        (Some(s), None) => s.to_string(),
        (None, Some(path)) => std::fs::read_to_string(path)
            .map_err(|source| SecretError::Read { path: path.to_path_buf(), source })?
            .lines()
            .next()
            .unwrap_or_default()
            .to_string(),
        (None, None) => return Err(SecretError::Missing),
    };
    let text = text.trim_end_matches(['\r', '\n']);
    JoinSecret::new(text).map_err(|_| SecretError::Empty)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_come_from_one_place_and_must_not_be_empty() {
        assert!(read_secret(Some("s"), None).is_ok());
        assert!(matches!(read_secret(None, None), Err(SecretError::Missing)));
        assert!(matches!(read_secret(Some(""), None), Err(SecretError::Empty)));
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("secret");
        std::fs::write(&f, "from-file\nignored\n").expect("write");
        assert!(read_secret(None, Some(&f)).is_ok());
        assert!(matches!(read_secret(Some("s"), Some(&f)), Err(SecretError::Both)));
        let err = read_secret(None, Some(&dir.path().join("missing"))).unwrap_err();
        assert!(err.to_string().contains("cannot read the join secret file"), "{err}");
    }
}
