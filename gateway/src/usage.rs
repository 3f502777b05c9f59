//! `tela usage`: an `sreport`-like view of the usage ledger ([`crate::ledger`]) — requests,
//! errors, the engines' prompt and completion tokens and the time requests held, summed per
//! key, account, model, node, UTC day, kind (`interactive` or `batch`) or outside provider
//! (`provider`: the `[[overflow]]` provider that served it, `-` for the federation) — or several of them:
//! `--by account,kind` — over a range of days, as a table, CSV or JSON.
//!
//! Every gateway keeps its own ledger. Give each file with `--ledger` (copies are fine) and
//! the report sums them: a request is in exactly one gateway's ledger, so the sum is the
//! federation's use. The files are opened read-only; a running gateway keeps writing.
//!
//! `request_seconds` is the sum of the requests' latencies (arrival to last byte): the time
//! they held a place on an engine, the nearest the gateway comes to the GPU time an account
//! used.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::db::DbError;

/// A report's grouping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum GroupBy {
    /// The key's name (`-`: a gateway without keys).
    Key,
    /// The account the key charges (`-`: none).
    Account,
    /// The model asked for.
    Model,
    /// The node that answered (`-`: the gateway answered itself).
    Node,
    /// The UTC day the request arrived.
    Day,
    /// `interactive`, or `batch` for a request of a batch ([`crate::batch`]).
    Kind,
    /// The outside provider that served or failed it ([`crate::overflow`]; `-`: the federation).
    Provider,
}

impl GroupBy {
    /// The column's name.
    pub fn name(self) -> &'static str {
        match self {
            GroupBy::Key => "key",
            GroupBy::Account => "account",
            GroupBy::Model => "model",
            GroupBy::Node => "node",
            GroupBy::Day => "day",
            GroupBy::Kind => "kind",
            GroupBy::Provider => "provider",
        }
    }

    fn sql(self) -> &'static str {
        match self {
            GroupBy::Key => "COALESCE(key_name, '-')",
            GroupBy::Account => "COALESCE(account, '-')",
            GroupBy::Model => "model",
            GroupBy::Node => "COALESCE(node, '-')",
            GroupBy::Day => "date(time_ms / 1000, 'unixepoch')",
            GroupBy::Kind => "CASE WHEN batch_id IS NULL THEN 'interactive' ELSE 'batch' END",
            GroupBy::Provider => "COALESCE(provider, '-')",
        }
    }
}

/// How a report is printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned columns and a total line.
    Table,
    /// A header line and one line per group.
    Csv,
    /// One object: the query, the groups and the total.
    Json,
}

/// A UTC calendar day, `YYYY-MM-DD`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Day {
    /// Days since 1970-01-01.
    pub days: i64,
}

/// The text is not a calendar day written `YYYY-MM-DD`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' is not a date: write YYYY-MM-DD (UTC), e.g. 2024-03-01")]
pub struct NotADay(pub String);

impl std::str::FromStr for Day {
    type Err = NotADay;

    fn from_str(s: &str) -> Result<Day, NotADay> {
        let bad = || NotADay(s.to_string());
        let mut parts = s.trim().splitn(3, '-');
        let (Some(y), Some(m), Some(d)) = (parts.next(), parts.next(), parts.next()) else { return Err(bad()) };
        if y.len() != 4 || m.len() != 2 || d.len() != 2 {
            return Err(bad());
        }
        let (y, m, d): (i64, u32, u32) =
            (y.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?, d.parse().map_err(|_| bad())?);
        let days = crate::limits::days_from_civil(y, m, d);
        // 2024-02-30 comes back as another day: refused.
        if !(1..=12).contains(&m) || crate::limits::civil_from_days(days) != (y, m, d) {
            return Err(bad());
        }
        Ok(Day { days })
    }
}

impl std::fmt::Display for Day {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (y, m, d) = crate::limits::civil_from_days(self.days);
        write!(f, "{y:04}-{m:02}-{d:02}")
    }
}

/// What to report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Query {
    /// The grouping columns, in order (at least one).
    pub by: Vec<GroupBy>,
    /// From the start of this day.
    pub since: Option<Day>,
    /// To the end of this day.
    pub until: Option<Day>,
}

impl Query {
    /// `[from, to)` in Unix milliseconds.
    fn range_ms(&self) -> (i64, i64) {
        const DAY_MS: i64 = 86_400_000;
        let from = self.since.map_or(i64::MIN, |d| d.days * DAY_MS);
        let to = self.until.map_or(i64::MAX, |d| (d.days + 1) * DAY_MS);
        (from, to)
    }
}

/// The sums of one group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sums {
    /// Requests.
    pub requests: u64,
    /// Of which answered with status 400 or above.
    pub errors: u64,
    /// Prompt tokens the engines reported.
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
    /// Summed latency, milliseconds.
    pub latency_ms: u64,
}

impl Sums {
    fn add(&mut self, other: &Sums) {
        self.requests += other.requests;
        self.errors += other.errors;
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
        self.latency_ms += other.latency_ms;
    }

    fn request_seconds(&self) -> f64 {
        self.latency_ms as f64 / 1000.0
    }
}

/// A report: one line of sums per group, in the groups' order.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// What was asked.
    pub query: Query,
    /// How many ledgers were read.
    pub ledgers: usize,
    /// Each group's values (one per grouping column) and sums.
    pub rows: BTreeMap<Vec<String>, Sums>,
}

/// A ledger could not be read.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    /// It could not be opened.
    #[error(transparent)]
    Open(#[from] DbError),
    /// The query failed.
    #[error("cannot read the ledger {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What SQLite said.
        source: rusqlite::Error,
    },
}

/// Reads `ledgers` and sums them as `query` says.
pub fn report(ledgers: &[PathBuf], query: &Query) -> Result<Report, UsageError> {
    let mut rows: BTreeMap<Vec<String>, Sums> = BTreeMap::new();
    for path in ledgers {
        for (group, sums) in read_one(path, query)? {
            rows.entry(group).or_default().add(&sums);
        }
    }
    Ok(Report { query: query.clone(), ledgers: ledgers.len(), rows })
}

fn read_one(path: &Path, query: &Query) -> Result<Vec<(Vec<String>, Sums)>, UsageError> {
    // `kind` reads the column batch inference added (schema version 2), `provider` the one
    // overflow added (3).
    let needed = if query.by.contains(&GroupBy::Provider) {
        3
    } else if query.by.contains(&GroupBy::Kind) {
        2
    } else {
        1
    };
    let conn = crate::db::open_read_only(path, needed)?;
    let read = |source| UsageError::Read { path: path.to_path_buf(), source };
    let columns: Vec<&str> = query.by.iter().map(|g| g.sql()).collect();
    let groups = columns.join(", ");
    let sql = format!(
        "SELECT {groups}, COUNT(*), COALESCE(SUM(status >= 400), 0), COALESCE(SUM(prompt_tokens), 0),
                COALESCE(SUM(completion_tokens), 0), COALESCE(SUM(latency_ms), 0)
         FROM requests WHERE time_ms >= ?1 AND time_ms < ?2 GROUP BY {groups}"
    );
    let (from, to) = query.range_ms();
    let mut statement = conn.prepare(&sql).map_err(read)?;
    let n = columns.len();
    let count = |row: &rusqlite::Row<'_>, i: usize| row.get::<_, i64>(i).map(|v| v.max(0) as u64);
    let rows = statement
        .query_map([from, to], |row| {
            let mut group = Vec::with_capacity(n);
            for i in 0..n {
                group.push(row.get::<_, Option<String>>(i)?.unwrap_or_else(|| "-".into()));
            }
            let sums = Sums {
                requests: count(row, n)?,
                errors: count(row, n + 1)?,
                prompt_tokens: count(row, n + 2)?,
                completion_tokens: count(row, n + 3)?,
                latency_ms: count(row, n + 4)?,
            };
            Ok((group, sums))
        })
        .map_err(read)?;
    rows.collect::<Result<Vec<_>, _>>().map_err(read)
}

/// The columns after the groups.
const SUM_COLUMNS: [&str; 6] =
    ["requests", "errors", "prompt_tokens", "completion_tokens", "total_tokens", "request_seconds"];

fn sum_cells(s: &Sums) -> [String; 6] {
    [
        s.requests.to_string(),
        s.errors.to_string(),
        s.prompt_tokens.to_string(),
        s.completion_tokens.to_string(),
        (s.prompt_tokens + s.completion_tokens).to_string(),
        format!("{:.1}", s.request_seconds()),
    ]
}

impl Report {
    /// All groups together.
    pub fn total(&self) -> Sums {
        let mut total = Sums::default();
        for s in self.rows.values() {
            total.add(s);
        }
        total
    }

    fn period(&self) -> String {
        let since = self.query.since.map_or_else(|| "the first row".to_string(), |d| d.to_string());
        let until = self.query.until.map_or_else(|| "the last row".to_string(), |d| d.to_string());
        format!("{since} to {until} (UTC)")
    }

    /// Aligned columns with a header, a rule and a total line.
    pub fn table(&self) -> String {
        let mut lines: Vec<Vec<String>> = Vec::new();
        let header: Vec<String> =
            self.query.by.iter().map(|g| g.name()).chain(SUM_COLUMNS).map(str::to_uppercase).collect();
        lines.push(header);
        for (group, sums) in &self.rows {
            lines.push(group.iter().cloned().chain(sum_cells(sums)).collect());
        }
        let mut total: Vec<String> = vec!["TOTAL".to_string()];
        total.resize(self.query.by.len(), String::new());
        total.extend(sum_cells(&self.total()));
        lines.push(total);
        let widths: Vec<usize> =
            (0..lines[0].len()).map(|c| lines.iter().map(|l| l[c].chars().count()).max().unwrap_or(0)).collect();
        let groups = self.query.by.len();
        let mut out = format!("Usage from {}, {} ledger(s)\n", self.period(), self.ledgers);
        let rule: String = widths.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>().join("  ");
        let last = lines.len() - 1;
        for (i, line) in lines.iter().enumerate() {
            if i == last {
                let _ = writeln!(out, "{rule}");
            }
            let cells: Vec<String> = line
                .iter()
                .enumerate()
                .map(|(c, cell)| {
                    // Names left, numbers right.
                    if c < groups {
                        format!("{cell:<w$}", w = widths[c])
                    } else {
                        format!("{cell:>w$}", w = widths[c])
                    }
                })
                .collect();
            let _ = writeln!(out, "{}", cells.join("  ").trim_end());
            if i == 0 {
                let _ = writeln!(out, "{rule}");
            }
        }
        out
    }

    /// A header line and one line per group (no total: spreadsheets add their own).
    pub fn csv(&self) -> String {
        let mut out = String::new();
        let header: Vec<&str> = self.query.by.iter().map(|g| g.name()).chain(SUM_COLUMNS).collect();
        let _ = writeln!(out, "{}", header.join(","));
        for (group, sums) in &self.rows {
            let cells: Vec<String> = group.iter().map(|g| csv_field(g)).chain(sum_cells(sums)).collect();
            let _ = writeln!(out, "{}", cells.join(","));
        }
        out
    }

    /// `{"by", "since", "until", "ledgers", "rows": [{<group columns>, <sums>}], "total"}`.
    pub fn json(&self) -> serde_json::Value {
        let sums = |s: &Sums| {
            serde_json::json!({
                "requests": s.requests,
                "errors": s.errors,
                "prompt_tokens": s.prompt_tokens,
                "completion_tokens": s.completion_tokens,
                "total_tokens": s.prompt_tokens + s.completion_tokens,
                "request_seconds": s.request_seconds(),
            })
        };
        let rows: Vec<serde_json::Value> = self
            .rows
            .iter()
            .map(|(group, s)| {
                let mut row = sums(s);
                for (by, value) in self.query.by.iter().zip(group) {
                    row[by.name()] = serde_json::Value::String(value.clone());
                }
                row
            })
            .collect();
        serde_json::json!({
            "by": self.query.by.iter().map(|g| g.name()).collect::<Vec<_>>(),
            "since": self.query.since.map(|d| d.to_string()),
            "until": self.query.until.map(|d| d.to_string()),
            "ledgers": self.ledgers,
            "rows": rows,
            "total": sums(&self.total()),
        })
    }

    /// The report in `format`.
    pub fn render(&self, format: Format) -> String {
        match format {
            Format::Table => self.table(),
            Format::Csv => self.csv(),
            Format::Json => format!("{:#}\n", self.json()),
        }
    }
}

fn csv_field(value: &str) -> String {
    if value.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", value.replace('"', "\"\""))
    } else {
        value.to_string()
    }
}

/// Report usage from gateways' ledgers: requests, errors, the engines' prompt and completion
/// tokens, and request_seconds (summed latency, arrival to last byte: the time requests held
/// an engine), per key, account, model, node, UTC day, kind or overflow provider. Several --ledger files (one per
/// gateway) are summed.
#[derive(Debug, Clone, clap::Args)]
pub struct UsageArgs {
    /// A gateway's database file (repeat for several gateways) [default: gateway.db beside the
    /// default identity, as `tela gateway` writes it].
    #[arg(long = "ledger", value_name = "PATH")]
    pub ledgers: Vec<PathBuf>,

    /// Group by these columns, in order (comma-separated).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "account",
        value_name = "key|account|model|node|day|kind|provider"
    )]
    pub by: Vec<GroupBy>,

    /// From the start of this UTC day.
    #[arg(long, value_name = "YYYY-MM-DD")]
    pub since: Option<Day>,

    /// To the end of this UTC day (included).
    #[arg(long, value_name = "YYYY-MM-DD")]
    pub until: Option<Day>,

    /// How to print it.
    #[arg(long, default_value = "table", value_name = "table|csv|json")]
    pub format: Format,
}

impl UsageArgs {
    /// Reads the ledgers and prints the report on stdout.
    pub fn run(self) -> anyhow::Result<()> {
        let ledgers = if self.ledgers.is_empty() {
            let identity = tela_runtime::identity::default_identity_path("gateway.key")?;
            vec![crate::ledger::default_path(&identity)]
        } else {
            self.ledgers
        };
        if let (Some(since), Some(until)) = (self.since, self.until) {
            anyhow::ensure!(since.days <= until.days, "--since {since} is after --until {until}");
        }
        let query = Query { by: self.by, since: self.since, until: self.until };
        let report = report(&ledgers, &query)?;
        print!("{}", report.render(self.format));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{insert, Row};

    const DAY_MS: i64 = 86_400_000;

    fn day(s: &str) -> Day {
        s.parse().expect("a date")
    }

    fn row(time_ms: i64, key: &str, account: Option<&str>, model: &str, tokens: (u64, u64), status: u16) -> Row {
        Row {
            time_ms,
            key_name: Some(key.into()),
            account: account.map(str::to_string),
            model: model.into(),
            endpoint: "/v1/chat/completions".into(),
            status,
            outcome: "complete",
            prompt_tokens: (status < 400).then_some(tokens.0),
            completion_tokens: (status < 400).then_some(tokens.1),
            latency_ms: 1500,
            ..Row::default()
        }
    }

    /// Two gateways' ledgers.
    fn ledgers(dir: &Path) -> Vec<PathBuf> {
        let d1 = day("2024-03-01").days * DAY_MS;
        let d2 = day("2024-03-02").days * DAY_MS;
        let a = dir.join("a.db");
        let b = dir.join("b.db");
        insert(
            &mut crate::db::open(&a).expect("a"),
            &[
                row(d1 + 5, "alice", Some("proj-1"), "m1", (10, 20), 200),
                row(d2 + 5, "alice", Some("proj-1"), "m2", (1, 2), 200),
                row(d2 + 6, "bob", Some("proj-2"), "m1", (0, 0), 429),
            ],
        )
        .expect("insert a");
        insert(
            &mut crate::db::open(&b).expect("b"),
            &[
                row(d1 + 7, "alice", Some("proj-1"), "m1", (100, 200), 200),
                row(d2 + 8, "carol", None, "m1", (3, 4), 200),
            ],
        )
        .expect("insert b");
        vec![a, b]
    }

    fn query(by: &[GroupBy]) -> Query {
        Query { by: by.to_vec(), since: None, until: None }
    }

    #[test]
    fn several_ledgers_are_summed_per_group() {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = ledgers(dir.path());
        let r = report(&files, &query(&[GroupBy::Account])).expect("report");
        let get = |k: &str| r.rows[&vec![k.to_string()]];
        assert_eq!(
            get("proj-1"),
            Sums { requests: 3, errors: 0, prompt_tokens: 111, completion_tokens: 222, latency_ms: 4500 }
        );
        assert_eq!((get("proj-2").requests, get("proj-2").errors, get("proj-2").prompt_tokens), (1, 1, 0));
        assert_eq!(get("-").prompt_tokens, 3, "a key without an account");
        assert_eq!(r.total().requests, 5);

        let by_key_model = report(&files, &query(&[GroupBy::Key, GroupBy::Model])).expect("report");
        let keys: Vec<String> = by_key_model.rows.keys().map(|k| k.join("/")).collect();
        assert_eq!(keys, ["alice/m1", "alice/m2", "bob/m1", "carol/m1"]);
        let by_day = report(&files, &query(&[GroupBy::Day])).expect("report");
        assert_eq!(by_day.rows[&vec!["2024-03-01".to_string()]].requests, 2);
        assert_eq!(by_day.rows[&vec!["2024-03-02".to_string()]].requests, 3);
    }

    #[test]
    fn since_and_until_take_whole_utc_days() {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = ledgers(dir.path());
        let only = |since: Option<&str>, until: Option<&str>| {
            let q = Query { by: vec![GroupBy::Day], since: since.map(day), until: until.map(day) };
            report(&files, &q).expect("report").rows.keys().map(|k| k[0].clone()).collect::<Vec<_>>()
        };
        assert_eq!(only(Some("2024-03-02"), None), ["2024-03-02"]);
        assert_eq!(only(None, Some("2024-03-01")), ["2024-03-01"], "until includes its day");
        assert_eq!(only(Some("2024-03-03"), None), Vec::<String>::new());
        assert!("2024-02-30".parse::<Day>().is_err());
        assert!("2024-3-1".parse::<Day>().is_err());
        assert!("yesterday".parse::<Day>().is_err());
        assert_eq!(day("2024-02-29").to_string(), "2024-02-29");
    }

    #[test]
    fn formats_show_the_same_sums() {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = ledgers(dir.path());
        let r = report(&files, &query(&[GroupBy::Key])).expect("report");
        let table = r.table();
        let alice = table.lines().find(|l| l.starts_with("alice")).expect("alice's line");
        let cells: Vec<&str> = alice.split_whitespace().collect();
        assert_eq!(cells, ["alice", "3", "0", "111", "222", "333", "4.5"], "{table}");
        assert!(table.lines().any(|l| l.starts_with("TOTAL") && l.split_whitespace().nth(1) == Some("5")), "{table}");
        assert!(table.lines().nth(1).is_some_and(|l| l.starts_with("KEY")), "{table}");

        let csv = r.csv();
        let mut lines = csv.lines();
        assert_eq!(
            lines.next(),
            Some("key,requests,errors,prompt_tokens,completion_tokens,total_tokens,request_seconds")
        );
        assert!(csv.lines().any(|l| l == "alice,3,0,111,222,333,4.5"), "{csv}");
        assert_eq!(csv_field("a,\"b\""), "\"a,\"\"b\"\"\"");

        let json = r.json();
        let alice = json["rows"].as_array().expect("rows").iter().find(|r| r["key"] == "alice").expect("alice");
        assert_eq!((alice["prompt_tokens"].as_u64(), alice["total_tokens"].as_u64()), (Some(111), Some(333)));
        assert_eq!(json["total"]["requests"], 5);
        assert_eq!(json["by"], serde_json::json!(["key"]));
    }

    #[test]
    fn a_file_that_is_not_a_ledger_is_named_in_the_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("nope.db");
        let err = report(std::slice::from_ref(&missing), &query(&[GroupBy::Key])).expect_err("no such file");
        assert!(err.to_string().contains("nope.db"), "{err}");
    }
}
