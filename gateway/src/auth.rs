//! API keys: a file of SHA-256 hashes, each with an optional name, owner, account, allowed
//! models and limits; checked on every request and reloaded when the file changes.
//!
//! # The key file
//!
//! One key per line; blank lines and lines starting with `#` are ignored:
//!
//! ```text
//! # old style: a hash and an optional label (the key's name)
//! sha256:5e8f…<64 hex digits> alice
//! # named entries: any of these fields, in any order, after the hash
//! sha256:9a1b…<64 hex digits> name=lab-a owner="Ada Lovelace" account=proj-42 models=llama-3-8b,qwen-7b rpm=60 tpm=100000 concurrent=4 budget_tokens=5000000/month
//! ```
//!
//! | field | value | default |
//! |---|---|---|
//! | `name` | what logs, metrics and errors call the key | the label, else `sha256:` and the hash's first 8 digits |
//! | `owner` | who holds it | none |
//! | `account` | the Slurm account or project its use is charged to | none |
//! | `models` | the models it may use, `m1,m2`, or `*` for all | `*` |
//! | `rpm`, `tpm` | requests, tokens per minute | no limit |
//! | `concurrent` | requests in flight at once | no limit |
//! | `budget_tokens` | `N/day`, `N/week` or `N/month` (UTC calendar periods), interactive and batch tokens together | no budget |
//! | `batch_tpm` | tokens per minute of the key's batches, paced, apart from `tpm` | no limit |
//! | `batch_budget_tokens` | like `budget_tokens`, for the key's batch tokens alone | no budget |
//! | `batch_gpu_hours` | `N/day`, `N/week` or `N/month`: GPU-hours of the jobs the spinner starts for the key's batch backlog ([`crate::spin::batch_demand`]); once spent, the key's backlog no longer starts jobs (its batches still run on nodes that serve) | no budget |
//! | `overflow` | `yes`: when the federation cannot take a request, it may go to an outside provider of the gateway's `[[overflow]]` sections ([`crate::overflow`]), charged to this key; `no` | `no` |
//!
//! The limits are enforced by [`crate::limits`]. Numbers are positive whole numbers. A value
//! with spaces is written in double quotes (`owner="Ada Lovelace"`; `\"` and `\\` inside
//! quotes stand for `"` and `\`). Bare words right after the hash are the old-style label,
//! which names the key; a bare word after a field, an unknown or repeated field, a bad number,
//! a label together with `name=`, and a hash that appears on two lines are errors. A word
//! starting with `#` begins a comment to the end of the line. `tela gateway hash-key` writes
//! such lines (it quotes what needs quoting and checks the line parses). The one old label that
//! no longer reads as before is one with an unquoted `=` or an unclosed `"`: the file is then
//! refused with the line named, and quoting the label (`"a=b"`) fixes it.
//!
//! A key not allowed a model gets, for that model, exactly the 404 a model nobody serves gets,
//! and `/v1/models` lists only its models, so model names do not leak between tenants; for the
//! same reason such a key may not read `/status` or `/metrics` (403). Keys may share a name
//! (one person's old and new key while rotating).
//!
//! The gateway never sees or stores the keys themselves, so a leaked file does not leak them.
//! Why SHA-256 and not a password hash (argon2, bcrypt): API keys are long random strings, not
//! passwords people choose, so there is nothing to brute-force and a slow hash would only add
//! milliseconds to every request. Keys made by `hash-key --generate` carry 256 random bits.
//!
//! # Reloading
//!
//! [`KeyFile::watch`] polls the file's modification time and size every
//! [`RELOAD_INTERVAL`] and swaps in the new set when they change; a file that cannot be read or
//! parsed keeps the previous set in force (and the log names the line and what is wrong with
//! it), so a half-written edit never locks everyone out or lets everyone in. A key whose hash
//! is in both the old and the new file keeps its counters ([`KeyCounters`]): editing the file
//! does not reset anyone's minute or budget, even when the edit changes that key's limits.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use http::header::HeaderMap;
use rand::RngCore;
use sha2::{Digest, Sha256};
use tela_runtime::snapshot::SnapshotCell;
use tokio_util::task::AbortOnDropHandle;

use crate::limits::{Budget, GpuHours, KeyCounters, KeyGuard, KeyLimits, Now, Period, RateHeaders, Refusal};

/// How often the key file is checked for changes.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(1);

/// The fields a key-file entry may set (see the module docs).
pub const FIELDS: &[&str] = &[
    "name",
    "owner",
    "account",
    "models",
    "rpm",
    "tpm",
    "concurrent",
    "budget_tokens",
    "batch_tpm",
    "batch_budget_tokens",
    "batch_gpu_hours",
    "overflow",
];

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

/// What is wrong with one key-file line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// The line does not start with a key hash.
    #[error("expected 'sha256:<64 hex digits>' first (make a line with `tela gateway hash-key`), found '{0:.40}'")]
    BadHash(String),
    /// A `field=value` with a field no entry has.
    #[error("unknown field '{0:.40}'; the fields are {fields}", fields = FIELDS.join(", "))]
    UnknownField(String),
    /// A field given twice.
    #[error("'{0}' is given twice; keep one")]
    RepeatedField(String),
    /// A field's value is not what the field takes.
    #[error("{field}={value:.40}: {problem}")]
    BadValue {
        /// The field.
        field: String,
        /// Its value.
        value: String,
        /// What it should be.
        problem: &'static str,
    },
    /// A bare word after the first field (a typo such as `rpm 60`, or an unquoted space).
    #[error("'{0:.40}' after the fields: write every field as field=value, and quote values with spaces")]
    StrayWord(String),
    /// Both an old-style label and `name=`.
    #[error("both a label ('{0:.40}') and name= name the key; keep one")]
    LabelAndName(String),
    /// A `"` without its closing `"`.
    #[error("a double quote is not closed")]
    UnclosedQuote,
}

/// The models a key may use.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ModelScope {
    /// Every model (`models=*`, or no `models=`).
    #[default]
    All,
    /// Only these.
    Only(BTreeSet<String>),
}

impl ModelScope {
    /// Whether the key may use `model`.
    pub fn allows(&self, model: &str) -> bool {
        match self {
            ModelScope::All => true,
            ModelScope::Only(models) => models.contains(model),
        }
    }

    fn parse(value: &str) -> Option<ModelScope> {
        if value == "*" {
            return Some(ModelScope::All);
        }
        let models: BTreeSet<String> = value.split(',').map(|m| m.trim().to_string()).collect();
        if models.iter().any(|m| m.is_empty() || m == "*") {
            return None;
        }
        Some(ModelScope::Only(models))
    }
}

/// One key's entry in the key file.
#[derive(Debug)]
pub struct KeyEntry {
    /// What logs, metrics and errors call the key.
    pub name: String,
    /// Who holds it.
    pub owner: Option<String>,
    /// The Slurm account or project its use is charged to.
    pub account: Option<String>,
    /// The models it may use.
    pub models: ModelScope,
    /// Its limits.
    pub limits: KeyLimits,
    /// Whether its requests may go to an outside provider ([`crate::overflow`]).
    pub overflow: bool,
    /// Its line in the file.
    pub line: usize,
    counters: Arc<KeyCounters>,
}

impl KeyEntry {
    /// The key's counters, kept across reloads while its hash stays in the file.
    pub fn counters(&self) -> &Arc<KeyCounters> {
        &self.counters
    }

    /// Parses one line (not blank, not a comment) of a key file; `line` is its number.
    pub fn parse(text: &str, line: usize) -> Result<([u8; 32], KeyEntry), EntryError> {
        let mut words = words(text)?.into_iter();
        let first = words.next().ok_or_else(|| EntryError::BadHash(String::new()))?;
        let hash = first
            .text
            .strip_prefix("sha256:")
            .filter(|_| first.eq.is_none())
            .and_then(parse_digest)
            .ok_or_else(|| EntryError::BadHash(first.text.clone()))?;
        let mut entry = KeyEntry {
            name: String::new(),
            owner: None,
            account: None,
            models: ModelScope::All,
            limits: KeyLimits::default(),
            overflow: false,
            line,
            counters: Arc::default(),
        };
        let mut label: Vec<String> = Vec::new();
        let mut name = None;
        let mut given: Vec<String> = Vec::new();
        for word in words {
            let Some(eq) = word.eq else {
                if !given.is_empty() {
                    return Err(EntryError::StrayWord(word.text));
                }
                label.push(word.text);
                continue;
            };
            let (field, value) = (&word.text[..eq], &word.text[eq + 1..]);
            if !FIELDS.contains(&field) {
                return Err(EntryError::UnknownField(field.to_string()));
            }
            if given.iter().any(|g| g == field) {
                return Err(EntryError::RepeatedField(field.to_string()));
            }
            given.push(field.to_string());
            let bad = |problem: &'static str| EntryError::BadValue {
                field: field.to_string(),
                value: value.to_string(),
                problem,
            };
            if value.is_empty() {
                return Err(bad("the value is empty; give one, or leave the field out"));
            }
            const NUMBER: &str = "expected a positive whole number (leave the field out for no limit)";
            match field {
                "name" => name = Some(value.to_string()),
                "owner" => entry.owner = Some(value.to_string()),
                "account" => entry.account = Some(value.to_string()),
                "models" => {
                    entry.models = ModelScope::parse(value)
                        .ok_or_else(|| bad("expected model names separated by commas, or * for every model"))?;
                }
                "rpm" => entry.limits.requests_per_minute = Some(positive(value).ok_or_else(|| bad(NUMBER))?),
                "tpm" => entry.limits.tokens_per_minute = Some(positive(value).ok_or_else(|| bad(NUMBER))?),
                "concurrent" => {
                    let n = positive(value).and_then(|n| u32::try_from(n).ok()).ok_or_else(|| bad(NUMBER))?;
                    entry.limits.concurrent = Some(n);
                }
                "overflow" => {
                    entry.overflow = match value {
                        "yes" | "true" => true,
                        "no" | "false" => false,
                        _ => return Err(bad("expected yes or no")),
                    };
                }
                "batch_tpm" => {
                    entry.limits.batch_tokens_per_minute = Some(positive(value).ok_or_else(|| bad(NUMBER))?);
                }
                "batch_gpu_hours" => {
                    let hours = value
                        .split_once('/')
                        .and_then(|(n, p)| Some(GpuHours { hours: positive(n)?, period: Period::parse(p)? }))
                        .ok_or_else(|| bad("expected <GPU-hours>/<day|week|month>, e.g. 100/week"))?;
                    entry.limits.batch_gpu_hours = Some(hours);
                }
                _ => {
                    let budget = value
                        .split_once('/')
                        .and_then(|(n, p)| Some(Budget { tokens: positive(n)?, period: Period::parse(p)? }))
                        .ok_or_else(|| bad("expected <tokens>/<day|week|month>, e.g. 1000000/month"))?;
                    if field == "batch_budget_tokens" {
                        entry.limits.batch_budget = Some(budget);
                    } else {
                        entry.limits.budget = Some(budget);
                    }
                }
            }
        }
        let label = (!label.is_empty()).then(|| label.join(" "));
        entry.name = match (label, name) {
            (Some(label), Some(_)) => return Err(EntryError::LabelAndName(label)),
            (Some(n), None) | (None, Some(n)) => n,
            (None, None) => format!("sha256:{}", hex(&hash[..4])),
        };
        Ok((hash, entry))
    }
}

fn positive(value: &str) -> Option<u64> {
    value.parse::<u64>().ok().filter(|n| *n > 0)
}

/// A word of a key-file line, its quotes resolved; `eq` is where its first unquoted `=` is.
struct Word {
    text: String,
    eq: Option<usize>,
}

/// Splits a line into words at unquoted whitespace, up to a word that starts with `#`.
fn words(line: &str) -> Result<Vec<Word>, EntryError> {
    let mut out = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if matches!(chars.peek(), None | Some('#')) {
            return Ok(out);
        }
        let (mut text, mut eq, mut quoted) = (String::new(), None, false);
        while let Some(c) = chars.next() {
            match c {
                '"' => quoted = !quoted,
                '\\' if quoted => text.push(chars.next().ok_or(EntryError::UnclosedQuote)?),
                c if c.is_whitespace() && !quoted => break,
                '=' if !quoted && eq.is_none() => {
                    eq = Some(text.len());
                    text.push('=');
                }
                c => text.push(c),
            }
        }
        if quoted {
            return Err(EntryError::UnclosedQuote);
        }
        out.push(Word { text, eq });
    }
}

/// A value as the key file writes it: bare when it can be, else in double quotes.
fn quote(value: &str) -> String {
    let bare = !value.is_empty()
        && !value.starts_with('#')
        && !value.chars().any(|c| c.is_whitespace() || c == '"' || c == '\\');
    if bare {
        return value.to_string();
    }
    let mut out = String::from("\"");
    for c in value.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
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

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The key-file line for `key`: `sha256:<hex>`.
pub fn key_line(key: &str) -> String {
    format!("sha256:{}", hex(&digest(key)))
}

/// The key-file line for `key` with `fields` (`("rpm", "60")`, ...), quoting values as needed.
pub fn entry_line(key: &str, fields: &[(&str, String)]) -> String {
    let mut line = key_line(key);
    for (field, value) in fields {
        line.push_str(&format!(" {field}={}", quote(value)));
    }
    line
}

/// A new random key: `tela-` and 64 hex digits (256 bits).
pub fn generate_key() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("tela-{}", hex(&bytes))
}

/// Who is calling: anyone (no keys) or the holder of a key, with what its limits said about
/// this request.
#[derive(Debug, Default)]
pub struct Caller {
    key: Option<Arc<KeyEntry>>,
    headers: Option<RateHeaders>,
}

/// The scope of a caller without a key.
static EVERY_MODEL: ModelScope = ModelScope::All;

impl Caller {
    /// A caller of a gateway without keys.
    pub fn anyone() -> Caller {
        Caller::default()
    }

    /// The holder of the key `entry`.
    pub fn holder(entry: Arc<KeyEntry>) -> Caller {
        Caller { key: Some(entry), headers: None }
    }

    /// The caller's key entry, if the gateway has keys.
    pub fn entry(&self) -> Option<&KeyEntry> {
        self.key.as_deref()
    }

    /// Whether the caller's requests may go to an outside provider: its key says
    /// `overflow=yes` (a gateway without keys never overflows).
    pub fn may_overflow(&self) -> bool {
        self.key.as_ref().is_some_and(|k| k.overflow)
    }

    /// The models the caller may use.
    pub fn models(&self) -> &ModelScope {
        self.key.as_ref().map_or(&EVERY_MODEL, |k| &k.models)
    }

    /// Admits an inference request under the key's limits (`estimate` gives its tokens, asked
    /// only when a limit counts tokens): the guard to hold until its response ends (`None` for
    /// a key without limits), or the refusal. Either way, the response's rate headers are
    /// what [`Caller::stamp`] then writes.
    pub fn admit(&mut self, estimate: impl FnOnce() -> u64, now: Now) -> Result<Option<KeyGuard>, Box<Refusal>> {
        let Some(entry) = self.key.as_ref().filter(|k| !k.limits.is_unlimited()) else { return Ok(None) };
        let cost = if entry.limits.counts_tokens() { estimate() } else { 0 };
        match entry.counters.admit(&entry.name, &entry.limits, cost, now) {
            Ok(admission) => {
                self.headers = Some(admission.headers);
                Ok(Some(admission.guard))
            }
            Err(refusal) => {
                self.headers = Some(refusal.headers);
                Err(refusal)
            }
        }
    }

    /// Adds the `x-ratelimit-*` headers of the key's rate limits, if it has any: as of its
    /// admission for an inference request, as of now for anything else.
    pub fn stamp(&self, headers: &mut HeaderMap) {
        let Some(entry) = self.key.as_ref().filter(|k| k.limits.has_rates()) else { return };
        let rates = self.headers.unwrap_or_else(|| entry.counters.headers(&entry.limits, Instant::now()));
        rates.write(headers);
    }
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
    /// header value as Azure-style clients send. Says who is calling, or why not.
    pub fn check(&self, authorization: Option<&[u8]>, api_key: Option<&[u8]>) -> Result<Caller, &'static str> {
        let keys = match self {
            Access::Open => return Ok(Caller::anyone()),
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
        match keys.entry(&presented) {
            Some(entry) => Ok(Caller::holder(entry.clone())),
            None => Err("the API key is not valid for this gateway"),
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

/// Print the key-file line for an API key read from stdin, or make a new key with --generate
/// (the key goes to stderr, for you to hand out; only its hash goes to stdout, so
/// `tela gateway hash-key --generate >> keys` stores no key).
///
/// The options name the key and set its limits; each becomes a `field=value` of the line.
/// Without them the line is the bare hash, which any gateway accepts.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct HashKeyArgs {
    /// Make a new random key instead of reading one from stdin.
    #[arg(long)]
    pub generate: bool,

    /// What logs, metrics and errors call the key [default: the hash's first digits].
    #[arg(long, value_name = "TEXT")]
    pub name: Option<String>,

    /// Who holds the key.
    #[arg(long, value_name = "TEXT")]
    pub owner: Option<String>,

    /// The Slurm account or project the key's use is charged to.
    #[arg(long, value_name = "TEXT")]
    pub account: Option<String>,

    /// The models the key may use, separated by commas, or * for all [default: *].
    #[arg(long, value_name = "M1,M2|*")]
    pub models: Option<String>,

    /// Requests per minute [default: no limit].
    #[arg(long, value_name = "N")]
    pub rpm: Option<String>,

    /// Tokens per minute, estimated from the prompt and max_tokens [default: no limit].
    #[arg(long, value_name = "N")]
    pub tpm: Option<String>,

    /// Requests in flight at once [default: no limit].
    #[arg(long, value_name = "N")]
    pub concurrent: Option<String>,

    /// Tokens per UTC calendar day, week (from Monday) or month [default: no budget].
    #[arg(long, value_name = "N/day|week|month")]
    pub budget_tokens: Option<String>,

    /// Tokens per minute of the key's batches, which the gateway paces to it; batches never
    /// use --tpm or --rpm [default: no limit].
    #[arg(long, value_name = "N")]
    pub batch_tpm: Option<String>,

    /// Batch tokens per UTC calendar day, week or month; batch tokens count toward
    /// --budget-tokens as well [default: no batch budget].
    #[arg(long, value_name = "N/day|week|month")]
    pub batch_budget_tokens: Option<String>,

    /// GPU-hours per UTC calendar day, week or month of the jobs the spinner starts for the
    /// key's batch backlog; once spent, its backlog starts no more jobs [default: no budget].
    #[arg(long, value_name = "N/day|week|month")]
    pub batch_gpu_hours: Option<String>,

    /// When the federation cannot take a request (no node serves the model, or every one is
    /// saturated), it may go to an outside provider of the gateway's `[[overflow]]` sections,
    /// charged to this key [default: never].
    #[arg(long)]
    pub overflow: bool,
}

impl HashKeyArgs {
    /// The fields the options set, in the key file's order.
    fn fields(&self) -> Vec<(&'static str, String)> {
        let options = [
            ("name", &self.name),
            ("owner", &self.owner),
            ("account", &self.account),
            ("models", &self.models),
            ("rpm", &self.rpm),
            ("tpm", &self.tpm),
            ("concurrent", &self.concurrent),
            ("budget_tokens", &self.budget_tokens),
            ("batch_tpm", &self.batch_tpm),
            ("batch_budget_tokens", &self.batch_budget_tokens),
            ("batch_gpu_hours", &self.batch_gpu_hours),
        ];
        let mut fields: Vec<(&'static str, String)> =
            options.into_iter().filter_map(|(field, value)| Some((field, value.clone()?))).collect();
        if self.overflow {
            fields.push(("overflow", "yes".to_string()));
        }
        fields
    }

    /// The line for `key`, checked to parse as the gateway will parse it.
    pub fn line(&self, key: &str) -> anyhow::Result<String> {
        let line = entry_line(key, &self.fields());
        match KeyEntry::parse(&line, 1) {
            Ok(_) => Ok(line),
            Err(EntryError::BadValue { field, value, problem }) => {
                anyhow::bail!("--{} '{value}': {problem}", field.replace('_', "-"))
            }
            Err(e) => anyhow::bail!("the options do not make a valid key-file line: {e}"),
        }
    }

    /// Prints the line to append to the key file.
    pub fn run(self) -> anyhow::Result<()> {
        // Checked before a key is made or read, so that a refused line hands out no key.
        self.line("check")?;
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
        println!("{}", self.line(&key)?);
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

    #[test]
    fn old_lines_keep_working_and_their_label_names_the_key() {
        let text =
            format!("{} alice from the lab\n{}\n{} bob # the builder\n", key_line("a"), key_line("b"), key_line("c"));
        let set = KeySet::parse(Path::new("keys"), &text).expect("old format");
        let a = set.entry("a").expect("a");
        assert_eq!(a.name, "alice from the lab");
        assert_eq!((a.models.clone(), a.limits, a.line), (ModelScope::All, KeyLimits::default(), 1));
        let b = set.entry("b").expect("b");
        assert_eq!(b.name, format!("sha256:{}", &key_line("b")["sha256:".len()..][..8]));
        assert_eq!(set.entry("c").expect("c").name, "bob", "a word starting with # begins a comment");
    }

    #[test]
    fn named_entries_carry_owner_account_models_and_limits() {
        let line = format!(
            "{} name=lab-a owner=\"Ada \\\"the countess\\\" Lovelace\" account=proj-42 models=llama,qwen \
             rpm=60 tpm=100000 concurrent=4 budget_tokens=5000000/month batch_tpm=20000 \
             batch_budget_tokens=1000000/week batch_gpu_hours=40/month # renewed yearly",
            key_line("k")
        );
        let set = KeySet::parse(Path::new("keys"), &format!("# keys\n{line}\n")).expect("valid");
        let e = set.entry("k").expect("k");
        assert_eq!(e.name, "lab-a");
        assert_eq!(e.owner.as_deref(), Some("Ada \"the countess\" Lovelace"));
        assert_eq!(e.account.as_deref(), Some("proj-42"));
        assert!(e.models.allows("llama") && e.models.allows("qwen") && !e.models.allows("mistral"));
        assert_eq!(
            e.limits,
            KeyLimits {
                requests_per_minute: Some(60),
                tokens_per_minute: Some(100_000),
                concurrent: Some(4),
                budget: Some(Budget { tokens: 5_000_000, period: Period::Month }),
                batch_tokens_per_minute: Some(20_000),
                batch_budget: Some(Budget { tokens: 1_000_000, period: Period::Week }),
                batch_gpu_hours: Some(GpuHours { hours: 40, period: Period::Month }),
            }
        );
        assert_eq!(e.line, 2);
        let batch_only = KeyEntry::parse(&format!("{} batch_tpm=5", key_line("b")), 1).expect("batch limit").1;
        assert!(batch_only.limits.is_unlimited(), "batch limits leave interactive requests uncounted");
        assert!(batch_only.limits.limits_batches());
        let star =
            KeyEntry::parse(&format!("{} alice models=* rpm=1", key_line("x")), 1).expect("label, then fields").1;
        assert_eq!((star.name.as_str(), star.models), ("alice", ModelScope::All));
    }

    #[test]
    fn each_bad_field_is_refused_with_its_line() {
        let cases: &[(&str, &str)] = &[
            ("colour=blue", "unknown field 'colour'"),
            ("rpm=0", "rpm=0: expected a positive whole number"),
            ("rpm=ten", "rpm=ten"),
            ("tpm=-5", "tpm=-5"),
            ("concurrent=99999999999", "concurrent=99999999999"),
            ("budget_tokens=100", "budget_tokens=100: expected <tokens>/<day|week|month>"),
            ("budget_tokens=100/year", "budget_tokens=100/year"),
            ("budget_tokens=0/day", "budget_tokens=0/day"),
            ("batch_tpm=0", "batch_tpm=0: expected a positive whole number"),
            ("batch_budget_tokens=5", "batch_budget_tokens=5: expected <tokens>/<day|week|month>"),
            ("batch_tpm=1 batch_tpm=2", "'batch_tpm' is given twice"),
            ("batch_gpu_hours=5", "batch_gpu_hours=5: expected <GPU-hours>/<day|week|month>"),
            ("batch_gpu_hours=0/day", "batch_gpu_hours=0/day"),
            ("batch_gpu_hours=2/year", "batch_gpu_hours=2/year"),
            ("models=a,,b", "models=a,,b: expected model names"),
            ("models=a,*", "models=a,*"),
            ("name=", "name=: the value is empty"),
            ("rpm=1 rpm=2", "'rpm' is given twice"),
            ("rpm=1 tpm 5", "'tpm' after the fields"),
            ("alice name=bob", "both a label ('alice') and name="),
            ("owner=\"Ada", "a double quote is not closed"),
            ("overflow=maybe", "overflow=maybe: expected yes or no"),
        ];
        for (fields, expected) in cases {
            let text = format!("# keys\n{}\n{} {fields}\n", key_line("good"), key_line("bad"));
            let err = KeySet::parse(Path::new("/etc/tela/keys"), &text).expect_err(fields).to_string();
            assert!(err.starts_with("/etc/tela/keys:3: "), "{fields}: {err}");
            assert!(err.contains(expected), "{fields}: {err}");
        }
        let twice = format!("{} a\n{} b\n", key_line("k"), key_line("k"));
        let err = KeySet::parse(Path::new("keys"), &twice).expect_err("the same key twice").to_string();
        assert!(err.contains("keys:2") && err.contains("line 1"), "{err}");
    }

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

    #[test]
    fn callers_see_their_models_and_get_their_headers() {
        let text = format!("{} models=a rpm=10\n{} plain\n", key_line("limited"), key_line("plain"));
        let set = KeySet::parse(Path::new("keys"), &text).expect("valid");
        let mut limited = Caller::holder(set.entry("limited").expect("limited").clone());
        assert!(limited.models().allows("a") && !limited.models().allows("b"));
        assert!(Caller::anyone().models().allows("b"));
        let mut headers = HeaderMap::new();
        limited.stamp(&mut headers);
        assert_eq!(headers["x-ratelimit-remaining-requests"], "10", "before any request: as of now");
        let guard = limited.admit(|| unreachable!("no token limit, no estimate"), Now::current()).expect("admitted");
        assert!(guard.is_some());
        let mut headers = HeaderMap::new();
        limited.stamp(&mut headers);
        assert_eq!(headers["x-ratelimit-limit-requests"], "10");
        assert_eq!(headers["x-ratelimit-remaining-requests"], "9");
        assert_eq!(headers["x-ratelimit-reset-requests"], "6s");
        assert!(headers.get("x-ratelimit-limit-tokens").is_none());
        let mut plain = Caller::holder(set.entry("plain").expect("plain").clone());
        assert!(plain.admit(|| 0, Now::current()).expect("no limits").is_none());
        let mut headers = HeaderMap::new();
        plain.stamp(&mut headers);
        assert!(headers.is_empty(), "a key without limits gets no rate headers");
    }

    #[test]
    fn hash_key_writes_lines_the_gateway_reads() {
        let args = HashKeyArgs {
            name: Some("lab a".into()),
            owner: Some("#1 \"fan\"".into()),
            models: Some("llama,qwen".into()),
            rpm: Some("60".into()),
            budget_tokens: Some("1000/week".into()),
            ..HashKeyArgs::default()
        };
        let line = args.line("secret").expect("valid options");
        assert!(line.starts_with(&key_line("secret")), "{line}");
        assert!(line.contains(" name=\"lab a\" ") && line.contains(" rpm=60 "), "{line}");
        let (_, entry) = KeyEntry::parse(&line, 1).expect("it parses");
        assert_eq!((entry.name.as_str(), entry.owner.as_deref()), ("lab a", Some("#1 \"fan\"")));
        assert_eq!(entry.limits.budget, Some(Budget { tokens: 1000, period: Period::Week }));
        assert!(!entry.overflow, "no overflow unless asked");
        let overflowing = HashKeyArgs { overflow: true, ..HashKeyArgs::default() }.line("secret").expect("valid");
        assert!(overflowing.ends_with(" overflow=yes"), "{overflowing}");
        assert!(KeyEntry::parse(&overflowing, 1).expect("it parses").1.overflow);
        let batch = HashKeyArgs {
            batch_tpm: Some("500".into()),
            batch_budget_tokens: Some("9000/day".into()),
            ..HashKeyArgs::default()
        };
        let line = batch.line("secret").expect("valid batch options");
        assert!(line.ends_with(" batch_tpm=500 batch_budget_tokens=9000/day"), "{line}");
        let limits = KeyEntry::parse(&line, 1).expect("it parses").1.limits;
        assert_eq!(limits.batch_tokens_per_minute, Some(500));
        assert_eq!(limits.batch_budget, Some(Budget { tokens: 9000, period: Period::Day }));
        let gpu = HashKeyArgs { batch_gpu_hours: Some("12/week".into()), ..HashKeyArgs::default() };
        let gpu_line = gpu.line("secret").expect("valid GPU-hour budget");
        assert!(gpu_line.ends_with(" batch_gpu_hours=12/week"), "{gpu_line}");
        let limits = KeyEntry::parse(&gpu_line, 1).expect("it parses").1.limits;
        assert_eq!(limits.batch_gpu_hours, Some(GpuHours { hours: 12, period: Period::Week }));
        let bad = HashKeyArgs { batch_gpu_hours: Some("12".into()), ..HashKeyArgs::default() };
        let err = bad.line("secret").expect_err("no period").to_string();
        assert!(err.starts_with("--batch-gpu-hours '12': expected"), "{err}");
        let set = KeySet::parse(
            Path::new("keys"),
            &format!(
                "{line}
{}
",
                key_line("other")
            ),
        )
        .expect("valid");
        let prefix = &key_line("secret")["sha256:".len()..][..12];
        assert_eq!(set.entry_by_hash_prefix(prefix).map(|e| e.line), Some(1), "the batch store's 12 digits find it");
        assert!(set.entry_by_hash_prefix("").is_none());
        let bad = HashKeyArgs { budget_tokens: Some("1000".into()), ..HashKeyArgs::default() };
        let err = bad.line("secret").expect_err("no period").to_string();
        assert!(err.starts_with("--budget-tokens '1000': expected"), "{err}");
        let bare = HashKeyArgs::default().line("secret").expect("no options");
        assert_eq!(bare, key_line("secret"), "no options, the bare hash as before");
    }
}
