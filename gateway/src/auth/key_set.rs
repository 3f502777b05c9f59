//! The key-file parser: a file's text read line by line (with line numbers) into the set of
//! accepted keys and their entries, and what makes a file unusable.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::entry::{EntryError, KeyEntry};
use super::hash::{digest, hex};

/// The key file could not be used; the keys in force stay in force.
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
    /// A line is not a valid entry.
    #[error("{path}:{line}: {problem}")]
    BadEntry {
        /// The file.
        path: PathBuf,
        /// The 1-based line number.
        line: usize,
        /// What is wrong with it.
        problem: EntryError,
    },
    /// The same key is on two lines, which could give it two sets of limits.
    #[error("{path}:{line}: this key is already on line {first}; keep one line per key")]
    DuplicateKey {
        /// The file.
        path: PathBuf,
        /// The 1-based line number of the second line.
        line: usize,
        /// The line of the first.
        first: usize,
    },
    /// The file holds no key, which would lock every client out.
    #[error("the API key file {0} holds no key; add lines made with `tela gateway hash-key`")]
    Empty(PathBuf),
}

/// The accepted keys and their entries.
#[derive(Debug, Default)]
pub struct KeySet {
    keys: HashMap<[u8; 32], Arc<KeyEntry>>,
}

impl KeySet {
    /// Parses a key file's text.
    pub fn parse(path: &Path, text: &str) -> Result<KeySet, KeyFileError> {
        let mut keys: HashMap<[u8; 32], Arc<KeyEntry>> = HashMap::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (hash, entry) = KeyEntry::parse(line, i + 1).map_err(|problem| KeyFileError::BadEntry {
                path: path.to_path_buf(),
                line: i + 1,
                problem,
            })?;
            if let Some(first) = keys.get(&hash) {
                return Err(KeyFileError::DuplicateKey { path: path.to_path_buf(), line: i + 1, first: first.line });
            }
            keys.insert(hash, Arc::new(entry));
        }
        if keys.is_empty() {
            return Err(KeyFileError::Empty(path.to_path_buf()));
        }
        Ok(KeySet { keys })
    }

    /// Reads and parses a key file.
    pub fn load(path: &Path) -> Result<KeySet, KeyFileError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| KeyFileError::Read { path: path.to_path_buf(), source })?;
        KeySet::parse(path, &text)
    }

    /// The entry of `key`, if it is accepted.
    pub fn entry(&self, key: &str) -> Option<&Arc<KeyEntry>> {
        self.keys.get(&digest(key))
    }

    /// Whether `key` is one of the accepted keys.
    pub fn accepts(&self, key: &str) -> bool {
        self.entry(key).is_some()
    }

    /// Every accepted key's hash (as the file holds it) and entry.
    pub fn entries(&self) -> impl Iterator<Item = (&[u8; 32], &Arc<KeyEntry>)> + '_ {
        self.keys.iter()
    }

    /// How many keys are accepted.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// True when no key is accepted.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The entry whose hash begins with `prefix`, hex digits as the ledger and the batch
    /// store name a key (`crate::ledger::key_hash`: 12 digits, 48 bits, so one key in practice).
    pub fn entry_by_hash_prefix(&self, prefix: &str) -> Option<&Arc<KeyEntry>> {
        if prefix.is_empty() {
            return None;
        }
        self.keys.iter().find(|(hash, _)| hex(&hash[..]).starts_with(prefix)).map(|(_, entry)| entry)
    }

    /// Takes over the counters of the keys `previous` also holds (a reload must not reset a
    /// key's minute or budget); returns how many it took over.
    pub fn keep_counters(&mut self, previous: &KeySet) -> usize {
        let mut kept = 0;
        for (hash, entry) in &mut self.keys {
            let (Some(old), Some(entry)) = (previous.keys.get(hash), Arc::get_mut(entry)) else { continue };
            entry.counters = old.counters.clone();
            kept += 1;
        }
        kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::access::Caller;
    use crate::auth::hash::key_line;
    use crate::limits::Now;

    #[test]
    fn a_reload_keeps_the_counters_of_unchanged_keys() {
        let path = Path::new("keys");
        let old =
            KeySet::parse(path, &format!("{} rpm=1\n{} rpm=1\n", key_line("stays"), key_line("goes"))).expect("old");
        let now = Now::current();
        let mut caller = Caller::holder(old.entry("stays").expect("stays").clone());
        drop(caller.admit(|| 0, now).expect("the first request"));
        // The same key with a new limit, and a new key.
        let text = format!("{} rpm=2\n{} rpm=1\n", key_line("stays"), key_line("new"));
        let mut new = KeySet::parse(path, &text).expect("new");
        assert_eq!(new.keep_counters(&old), 1);
        let stays = new.entry("stays").expect("stays");
        assert!(Arc::ptr_eq(stays.counters(), old.entry("stays").expect("stays").counters()));
        let mut caller = Caller::holder(stays.clone());
        caller.admit(|| 0, now).expect("the second of two");
        assert!(caller.admit(|| 0, now).is_err(), "the minute was not reset by the reload");
        let mut fresh = Caller::holder(new.entry("new").expect("new").clone());
        assert!(fresh.admit(|| 0, now).is_ok());
    }
}
