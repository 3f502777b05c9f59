//! API keys: a file of SHA-256 hashes, checked on every request and reloaded when it changes.
//!
//! # The key file
//!
//! One key per line as `sha256:<64 hex digits>`, optionally followed by whitespace and a label
//! (who the key is for); blank lines and lines starting with `#` are ignored. `tela gateway
//! hash-key` prints such a line for a key (or makes a new key). The gateway never sees or stores
//! the keys themselves, so a leaked file does not leak them.
//!
//! Why SHA-256 and not a password hash (argon2, bcrypt): API keys are long random strings, not
//! passwords people choose, so there is nothing to brute-force and a slow hash would only add
//! milliseconds to every request. Keys made by `hash-key --generate` carry 256 random bits.
//!
//! # Reloading
//!
//! [`KeyFile::watch`] polls the file's modification time and size every
//! [`RELOAD_INTERVAL`] and swaps in the new set when they change; a file that cannot be read or
//! parsed keeps the previous set in force (and says why in the log), so a half-written edit
//! never locks everyone out or lets everyone in.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rand::RngCore;
use sha2::{Digest, Sha256};
use tela_runtime::snapshot::SnapshotCell;
use tokio_util::task::AbortOnDropHandle;

/// How often the key file is checked for changes.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(1);

/// The key file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    /// It could not be read.
    #[error("cannot read the API key file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A line is not `sha256:<64 hex digits> [label]`.
    #[error(
        "{path}:{line}: expected 'sha256:<64 hex digits> [label]' (make one with `tela gateway hash-key`), found '{found:.40}'"
    )]
    BadLine {
        /// The file.
        path: PathBuf,
        /// The 1-based line number.
        line: usize,
        /// The start of the line.
        found: String,
    },
    /// The file holds no key, which would lock every client out.
    #[error("the API key file {0} holds no key; add lines made with `tela gateway hash-key`")]
    Empty(PathBuf),
}

/// A set of accepted key hashes.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct KeySet {
    hashes: HashSet<[u8; 32]>,
}

impl KeySet {
    /// Parses a key file's text.
    pub fn parse(path: &Path, text: &str) -> Result<KeySet, KeyFileError> {
        let mut hashes = HashSet::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = || KeyFileError::BadLine { path: path.to_path_buf(), line: i + 1, found: line.to_string() };
            let token = line.split_whitespace().next().ok_or_else(bad)?;
            let hex = token.strip_prefix("sha256:").ok_or_else(bad)?;
            hashes.insert(parse_digest(hex).ok_or_else(bad)?);
        }
        if hashes.is_empty() {
            return Err(KeyFileError::Empty(path.to_path_buf()));
        }
        Ok(KeySet { hashes })
    }

    /// Reads and parses a key file.
    pub fn load(path: &Path) -> Result<KeySet, KeyFileError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| KeyFileError::Read { path: path.to_path_buf(), source })?;
        KeySet::parse(path, &text)
    }

    /// Whether `key` is one of the accepted keys.
    pub fn accepts(&self, key: &str) -> bool {
        self.hashes.contains(&digest(key))
    }

    /// How many keys are accepted.
    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    /// True when no key is accepted.
    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// The key-file line for `key`: `sha256:<hex>`.
pub fn key_line(key: &str) -> String {
    let mut line = String::from("sha256:");
    for b in digest(key) {
        line.push_str(&format!("{b:02x}"));
    }
    line
}

/// A new random key: `tela-` and 64 hex digits (256 bits).
pub fn generate_key() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    let mut key = String::from("tela-");
    for b in bytes {
        key.push_str(&format!("{b:02x}"));
    }
    key
}

/// Who may call the API.
#[derive(Clone)]
pub enum Access {
    /// Anyone (`--no-auth`: loopback demos and tests only).
    Open,
    /// Holders of a key in the file.
    Keys(Arc<SnapshotCell<KeySet>>),
}

impl Access {
    /// Checks an `Authorization` header value (`Bearer <key>`); also accepts an `api-key`
    /// header value as Azure-style clients send.
    pub fn check(&self, authorization: Option<&[u8]>, api_key: Option<&[u8]>) -> Result<(), &'static str> {
        let keys = match self {
            Access::Open => return Ok(()),
            Access::Keys(keys) => keys.load(),
        };
        let presented = match (authorization, api_key) {
            (Some(h), _) => {
                let h = std::str::from_utf8(h).map_err(|_| "the Authorization header is not valid text")?;
                let (scheme, key) = h.trim().split_once(' ').ok_or("expected 'Authorization: Bearer <key>'")?;
                if !scheme.eq_ignore_ascii_case("bearer") {
                    return Err("expected 'Authorization: Bearer <key>'");
                }
                key.trim().to_string()
            }
            (None, Some(k)) => String::from_utf8_lossy(k).trim().to_string(),
            (None, None) => {
                return Err("no API key: send 'Authorization: Bearer <key>' (the OpenAI SDKs do this with api_key=...)")
            }
        };
        if keys.accepts(&presented) {
            Ok(())
        } else {
            Err("the API key is not valid for this gateway")
        }
    }
}

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
                    Ok(set) => {
                        tracing::info!("reloaded {}: {} API key(s)", path.display(), set.len());
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

/// Print the key-file line for an API key read from stdin, or make a new key with --generate
/// (the key goes to stderr, for you to hand out; only its hash goes to stdout, so
/// `tela gateway hash-key --generate >> keys` stores no key).
#[derive(Debug, Clone, clap::Args)]
pub struct HashKeyArgs {
    /// Make a new random key instead of reading one from stdin.
    #[arg(long)]
    pub generate: bool,
}

impl HashKeyArgs {
    /// Prints the line to append to the key file.
    pub fn run(self) -> anyhow::Result<()> {
        let key = if self.generate {
            let key = generate_key();
            eprintln!("new API key (hand it to the client; only its hash is printed below): {key}");
            key
        } else {
            let mut line = String::new();
            std::io::stdin().read_line(&mut line)?;
            let key = line.trim().to_string();
            anyhow::ensure!(!key.is_empty(), "no key on stdin; pipe one in, or pass --generate to make one");
            key
        };
        println!("{}", key_line(&key));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_checked_by_hash_and_bad_lines_are_named() {
        let path = Path::new("keys");
        let text = format!("# team keys\n{} alice\n\n{}\n", key_line("k1"), key_line("k2"));
        let set = KeySet::parse(path, &text).expect("valid");
        assert!(set.accepts("k1") && set.accepts("k2") && !set.accepts("k3"));
        let access = Access::Keys(Arc::new(SnapshotCell::new(set)));
        assert!(access.check(Some(b"Bearer k1"), None).is_ok());
        assert!(access.check(Some(b"bearer  k2 "), None).is_ok());
        assert!(access.check(Some(b"Bearer k3"), None).is_err());
        assert!(access.check(None, Some(b"k1")).is_ok());
        assert!(access.check(None, None).is_err());
        assert!(access.check(Some(b"Basic k1"), None).is_err());
        let err = KeySet::parse(path, "sha256:xyz\n").unwrap_err().to_string();
        assert!(err.contains("keys:1") && err.contains("hash-key"), "{err}");
        assert!(matches!(KeySet::parse(path, "# none\n"), Err(KeyFileError::Empty(_))));
        assert!(generate_key().starts_with("tela-"));
    }
}
