//! Node identities: a persistent Ed25519 key, the [`NodeId`] derived from it, and the
//! self-signed certificate that carries it through TLS.
//!
//! Identity is by key, not by certificate authority: a node's id is the first 16 bytes of the
//! SHA-256 of its raw Ed25519 public key, so the same key file always yields the same id and a
//! peer learns that id from the certificate it presents in the handshake (see [`crate::tls`]).
//! Federation membership is decided separately, by the join secret (see [`crate::admission`]).
//!
//! The key lives in `<config dir>/tela/identity.key` (on Linux `~/.config/tela/identity.key`)
//! unless the operator gives a path. It is a PKCS#8 PEM file created with mode 0600 on first
//! use and reused afterwards; losing it gives the node a new id, nothing more.

use rcgen::{CertificateParams, DnType, KeyPair, PKCS_ED25519};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use sha2::{Digest, Sha256};
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use tela_core::NodeId;
use thiserror::Error;

/// Why an identity could not be loaded or created. None of these change anything on disk
/// except [`IdentityError::Write`], which may leave a stray temporary file next to the key.
#[derive(Debug, Error)]
pub enum IdentityError {
    /// No per-user configuration directory could be determined.
    #[error(
        "cannot find a configuration directory for the identity key (is HOME set?) — \
         pass an explicit identity key path"
    )]
    NoConfigDir,
    /// The key file exists but could not be read.
    #[error("cannot read identity key {path}: {source} — check its permissions")]
    Read {
        /// The key file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The key file or its directory could not be written.
    #[error("cannot create identity key {path}: {source} — check that its directory is writable")]
    Write {
        /// The key file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The key file does not hold an Ed25519 PKCS#8 key.
    #[error(
        "identity key {path} is not a valid Ed25519 PKCS#8 PEM key ({detail}) — restore it from \
         a backup, or delete it to give this node a new identity"
    )]
    Corrupt {
        /// The key file.
        path: PathBuf,
        /// What was wrong with it.
        detail: String,
    },
    /// Key generation or certificate signing failed inside the crypto library.
    #[error("cannot generate the node identity: {0}")]
    Crypto(String),
}

/// A node's identity: its Ed25519 key pair, the [`NodeId`] derived from the public key, and a
/// self-signed certificate for TLS.
///
/// Cloning copies the private key; `Debug` prints only the id.
pub struct Identity {
    node_id: NodeId,
    public_key: [u8; 32],
    pkcs8: Vec<u8>,
    certificate: CertificateDer<'static>,
    signer: tela_core::Identity,
}

impl Clone for Identity {
    fn clone(&self) -> Identity {
        Identity {
            node_id: self.node_id,
            public_key: self.public_key,
            pkcs8: self.pkcs8.clone(),
            certificate: self.certificate.clone(),
            signer: self.signer.clone(),
        }
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity").field("node_id", &self.node_id).finish_non_exhaustive()
    }
}

impl Identity {
    /// The default key location: `<config dir>/tela/identity.key`.
    pub fn default_path() -> Result<PathBuf, IdentityError> {
        let dir = dirs::config_dir().ok_or(IdentityError::NoConfigDir)?;
        Ok(dir.join("tela").join("identity.key"))
    }

    /// Loads the identity at [`Identity::default_path`], creating it on first use.
    pub fn load_or_create_default() -> Result<Identity, IdentityError> {
        Identity::load_or_create(&Identity::default_path()?)
    }

    /// Loads the identity key at `path`, or creates one there (mode 0600, parent directories
    /// mode 0700) if the file does not exist yet.
    ///
    /// Creation is atomic: the key is written to a temporary file and linked into place, so a
    /// crash never leaves a half-written key and two processes starting at once end up with
    /// the same identity.
    pub fn load_or_create(path: &Path) -> Result<Identity, IdentityError> {
        match std::fs::read_to_string(path) {
            Ok(pem) => {
                warn_if_readable_by_others(path);
                Identity::from_pem(&pem)
                    .map_err(|e| IdentityError::Corrupt { path: path.to_path_buf(), detail: e.to_string() })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Identity::create(path),
            Err(source) => Err(IdentityError::Read { path: path.to_path_buf(), source }),
        }
    }

    /// A fresh identity that lives only in memory (tests, `tela demo`).
    pub fn generate() -> Result<Identity, IdentityError> {
        let key = KeyPair::generate_for(&PKCS_ED25519).map_err(|e| IdentityError::Crypto(e.to_string()))?;
        Identity::from_key(&key).map_err(|e| IdentityError::Crypto(e.to_string()))
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.node_id
    }

    /// The raw 32-byte Ed25519 public key.
    pub fn public_key(&self) -> &[u8; 32] {
        &self.public_key
    }

    /// The self-signed certificate presented in TLS handshakes (DER).
    pub fn certificate(&self) -> &CertificateDer<'static> {
        &self.certificate
    }

    /// The same key as the core signs records with ([`tela_core::Identity`]): its id is this
    /// identity's [`Identity::node_id`], so peers accept the records this node signs.
    pub fn signer(&self) -> &tela_core::Identity {
        &self.signer
    }

    pub(crate) fn private_key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.pkcs8.clone()))
    }

    fn create(path: &Path) -> Result<Identity, IdentityError> {
        let write_err = |source| IdentityError::Write { path: path.to_path_buf(), source };
        let key = KeyPair::generate_for(&PKCS_ED25519).map_err(|e| IdentityError::Crypto(e.to_string()))?;
        let pem = key.serialize_pem();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            create_private_dir(dir).map_err(write_err)?;
        }
        // Unique per process and per call, so concurrent creators never share a temporary.
        static ATTEMPT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let attempt = ATTEMPT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = path.with_extension(format!("tmp-{}-{attempt}", std::process::id()));
        let written = write_private_file(&tmp, pem.as_bytes()).and_then(|()| std::fs::hard_link(&tmp, path));
        let _ = std::fs::remove_file(&tmp);
        match written {
            Ok(()) => Identity::from_key(&key).map_err(|e| IdentityError::Crypto(e.to_string())),
            // Another process created it between our read and our link: use theirs.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Identity::load_or_create(path),
            Err(e) => Err(write_err(e)),
        }
    }

    fn from_pem(pem: &str) -> Result<Identity, KeyError> {
        let key = KeyPair::from_pkcs8_pem_and_sign_algo(pem, &PKCS_ED25519).map_err(KeyError::Pem)?;
        Identity::from_key(&key)
    }

    fn from_key(key: &KeyPair) -> Result<Identity, KeyError> {
        let public_key: [u8; 32] = key.public_key_raw().try_into().map_err(|_| KeyError::PublicKeyLength)?;
        let node_id = node_id_from_public_key(&public_key);
        let mut params = CertificateParams::new(vec!["tela".to_string()]).map_err(KeyError::Certificate)?;
        params.distinguished_name.push(DnType::CommonName, format!("tela node {node_id:?}"));
        let certificate = params.self_signed(key).map_err(KeyError::Certificate)?;
        let pkcs8 = key.serialize_der();
        let signer = tela_core::Identity::from_secret(&ed25519_secret(&pkcs8)?);
        if signer.id() != node_id {
            return Err(KeyError::Mismatch);
        }
        Ok(Identity { node_id, public_key, pkcs8, certificate: certificate.der().clone(), signer })
    }
}

/// Why a key pair does not make an [`Identity`]. Nothing is written; the caller reports the
/// key file as corrupt or the generation as failed.
#[derive(Debug, Error)]
enum KeyError {
    /// The PEM text is not an Ed25519 PKCS#8 key.
    #[error(transparent)]
    Pem(rcgen::Error),
    /// The public key has the wrong length.
    #[error("the public key is not 32 bytes long")]
    PublicKeyLength,
    /// The self-signed certificate could not be made.
    #[error(transparent)]
    Certificate(rcgen::Error),
    /// The PKCS#8 document lacks the Ed25519 algorithm identifier.
    #[error("no Ed25519 algorithm identifier")]
    NoAlgorithm,
    /// The PKCS#8 document holds no 32-byte secret where Ed25519 puts it.
    #[error("the private key is not a 32-byte Ed25519 secret")]
    SecretLength,
    /// The secret and the public key belong to different key pairs.
    #[error("the private key does not match its public key")]
    Mismatch,
}

/// The 32-byte Ed25519 secret in a PKCS#8 document (RFC 8410, v1 or v2): the octet string that
/// follows the Ed25519 algorithm identifier, itself an octet string of 32 bytes.
fn ed25519_secret(pkcs8: &[u8]) -> Result<[u8; 32], KeyError> {
    const ALGORITHM: [u8; 7] = [0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70];
    const SECRET: [u8; 4] = [0x04, 0x22, 0x04, 0x20];
    let at = pkcs8.windows(ALGORITHM.len()).position(|w| w == ALGORITHM).ok_or(KeyError::NoAlgorithm)?;
    let rest = &pkcs8[at + ALGORITHM.len()..];
    let secret = rest.strip_prefix(&SECRET[..]).and_then(|r| r.get(..32)).ok_or(KeyError::SecretLength)?;
    let mut out = [0u8; 32];
    out.copy_from_slice(secret);
    Ok(out)
}

/// The [`NodeId`] of a raw public key: the first 16 bytes of its SHA-256.
pub fn node_id_from_public_key(public_key: &[u8]) -> NodeId {
    let digest = Sha256::digest(public_key);
    let mut id = [0u8; 16];
    id.copy_from_slice(&digest[..16]);
    NodeId(id)
}

#[cfg(unix)]
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

#[cfg(not(unix))]
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)
}

fn write_private_file(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(path)?;
    file.write_all(contents)?;
    file.sync_all()
}

#[cfg(unix)]
fn warn_if_readable_by_others(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(path) {
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            tracing::warn!(
                path = %path.display(),
                "identity key is accessible by other users (mode {mode:o}); run `chmod 600 {}`",
                path.display()
            );
        }
    }
}

#[cfg(not(unix))]
fn warn_if_readable_by_others(_path: &Path) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_signed_with_the_key_whose_hash_is_the_node_id() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("identity.key");
        let first = Identity::load_or_create(&path).expect("create");
        assert_eq!(first.signer().id(), first.node_id());
        assert_eq!(&first.signer().public_key(), first.public_key());
        // The same key after a reload: the node keeps signing for the same id.
        let again = Identity::load_or_create(&path).expect("load");
        assert_eq!(again.signer(), first.signer());
        let mut record = tela_core::Record::new(
            first.node_id(),
            1,
            tela_core::Role::Serving,
            tela_core::Hardware::CPU,
            tela_core::Reachability::OutboundOnly,
        );
        first.signer().seal(&mut record);
        assert_eq!(tela_core::Verifier::strict().check(&record), Ok(()));
    }

    #[test]
    fn a_corrupt_key_file_is_a_typed_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("identity.key");
        std::fs::write(&path, "not a key").expect("write");
        let err = Identity::load_or_create(&path).expect_err("garbage must not load");
        assert!(matches!(err, IdentityError::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains("delete it"), "{err}");
    }

    #[test]
    fn node_id_is_the_hash_prefix_of_the_public_key() {
        let id = Identity::generate().expect("generate");
        let digest = Sha256::digest(id.public_key());
        assert_eq!(id.node_id().0[..], digest[..16]);
    }

    #[test]
    fn debug_does_not_print_the_key() {
        let id = Identity::generate().expect("generate");
        let shown = format!("{id:?}");
        assert!(!shown.contains("pkcs8"), "{shown}");
    }
}
