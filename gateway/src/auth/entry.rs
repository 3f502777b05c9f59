//! One key-file line: the key's entry (name, owner, account, models, limits), the fields it may
//! set and how it is parsed, word by word and with quotes, or written back.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::limits::{Budget, GpuHours, KeyCounters, KeyLimits, Period};

use super::hash::{hex, key_line, parse_digest};

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
    pub(super) counters: Arc<KeyCounters>,
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

/// The key-file line for `key` with `fields` (`("rpm", "60")`, ...), quoting values as needed.
pub fn entry_line(key: &str, fields: &[(&str, String)]) -> String {
    let mut line = key_line(key);
    for (field, value) in fields {
        line.push_str(&format!(" {field}={}", quote(value)));
    }
    line
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::auth::key_set::KeySet;

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
}
