//! The job template: what a spinner's `Submit { model, placement, walltime }` becomes — a
//! batch script that runs `tela node` (which launches and supervises the engine) and the
//! resources it asks for, as a [`JobRequest`] any [`BatchSystem`](super::BatchSystem) submits.
//!
//! # What the rendered script does
//!
//! 1. Makes a directory private to the job, `${TMPDIR:-/tmp}/tela-job-$SLURM_JOB_ID`, and keeps
//!    the node's identity key in it (`TELA_IDENTITY`). Every job is a new node with its own id,
//!    even when many jobs of one user share a home directory (the default key under
//!    `~/.config/tela` would make them one node). The directory goes when the script ends.
//! 2. Prints the node id (`tela node --print-id`, which creates the key) and writes it into the
//!    job's comment, `scontrol update JobId=$SLURM_JOB_ID Comment=tela-node=<32 hex digits>`,
//!    so that [`BatchJob::node`](super::BatchJob::node) links the job to the node for every
//!    backend. A failure there is logged and the node runs anyway.
//! 3. Starts `tela node --engine-cmd '<engine command>'` in the background and waits for it,
//!    passing SIGUSR1 (Slurm's walltime warning, a spinner's drain) and SIGTERM (scancel, the
//!    time limit) on to it. `wait` returns when a trapped signal arrives, so the traps run at
//!    once; the script then waits again until the node has exited, and exits with its status.
//!
//! The node learns its walltime from Slurm itself (`squeue %L` inside the job, see
//! `tela_runtime::walltime`) and starts draining one drain window before it; `--signal=B:USR1@...`
//! (sbatch) asks Slurm for a warning [`DRAIN_SIGNAL_SLACK`] earlier than that, as a second,
//! independent trigger that covers Slurm's 30-second limit checks. The drain window is passed
//! to the node (`TELA_DRAIN_WINDOW`). The engine runs with SIGUSR1 ignored: slurmrestd signals
//! every process of a job, and the default action of SIGUSR1 would kill the engine.
//!
//! # The engine command
//!
//! A shell command with placeholders, each replaced by a shell-quoted value:
//!
//! | placeholder | value |
//! |---|---|
//! | `{model}` | the model name clients ask for |
//! | `{variant}` | the checkpoint label the placement chose (`fp16`, `awq`, ...) |
//! | `{port}` | the engine's loopback port (`$TELA_ENGINE_PORT`, see [`JobTemplate::engine_port`]) |
//! | `{tp}` | GPUs per node (tensor parallelism) |
//! | `{pp}` | nodes (pipeline stages) |
//! | `{gpus}` | GPUs in all |
//!
//! `{{` and `}}` stand for literal braces; any other placeholder is a [`TemplateError`].
//!
//! ```
//! use std::time::Duration;
//! use tela_core::placement::{place, ModelSpec, NodeShape};
//! use tela_core::{GpuModel, Hardware, Quantization};
//! use tela_batch::template::JobTemplate;
//!
//! let shapes = [NodeShape::new("a100", Hardware::catalog(GpuModel::A100_80, 4), 2)];
//! let spec = ModelSpec::new("llama-70b", 70_000, Quantization::Bf16);
//! let placement = place(&spec, &shapes).unwrap();
//!
//! let mut template = JobTemplate::new(
//!     "/opt/tela/bin/tela",
//!     vec!["gw.example.org:7000".into()],
//!     "/home/svc/.tela/secret",
//!     "vllm serve {model} --port {port} --tensor-parallel-size {tp}",
//! );
//! template.partition = Some("gpu".into());
//! let job = template.render("llama-70b", &placement, Duration::from_secs(4 * 3600)).unwrap();
//! assert_eq!(job.gpus_per_node, u32::from(placement.tensor_parallel));
//! assert!(job.script.contains("--tensor-parallel-size 4"));
//! ```

use super::JobRequest;
use std::time::Duration;
use tela_core::placement::Placement;

/// How much earlier than the drain window the batch shell asks for Slurm's warning signal:
/// Slurm checks limits every 30 s, and the signal should not come after the node's own timer.
pub const DRAIN_SIGNAL_SLACK: Duration = Duration::from_secs(60);

/// The placeholders an engine command may use.
pub const PLACEHOLDERS: &[&str] = &["model", "variant", "port", "tp", "pp", "gpus"];

/// The first port of the range jobs pick their engine port from when none is configured.
pub const ENGINE_PORT_BASE: u32 = 20_000;

/// How many ports that range holds.
pub const ENGINE_PORT_SPAN: u32 = 10_000;

/// What a job of a federation looks like; one per spinner (see the module docs).
#[derive(Clone, Debug)]
pub struct JobTemplate {
    /// Path of the `tela` binary on the compute nodes.
    pub tela_bin: String,
    /// Gateways and anchors the node dials (`--join`).
    pub join: Vec<String>,
    /// Path of the join-secret file on the compute nodes (never the secret itself: scripts
    /// and job environments are readable by administrators and sometimes by other users).
    pub join_secret_file: String,
    /// The engine command, with placeholders.
    pub engine_cmd: String,
    /// The engine's port; `None`: the first free one from `20000 + job id mod 10000`
    /// (`tela node --print-free-port`), so that jobs sharing a host, and other services on it,
    /// do not collide.
    pub engine_port: Option<u16>,
    /// How long before the time limit the node starts draining.
    pub drain_window: Duration,
    /// A backfill-friendly job: the least time limit Slurm may shrink it to
    /// ([`JobRequest::time_min`]); the node reads the limit it got from Slurm, so it drains in
    /// time either way.
    pub time_min: Option<Duration>,
    /// Partition, if not the cluster's default.
    pub partition: Option<String>,
    /// Account to charge.
    pub account: Option<String>,
    /// Quality of service.
    pub qos: Option<String>,
    /// CPUs per node.
    pub cpus_per_task: u32,
    /// The jobs' working directory (their output files land there).
    pub working_dir: String,
    /// Environment for the job beyond what the template sets (`TELA_TRANSPORT`, `HF_HOME`,
    /// `TELA_VIA_SSH` or `TELA_RELAY` where compute nodes reach only the login host, ...).
    pub environment: Vec<(String, String)>,
    /// Job names are `<prefix>-<model>`.
    pub name_prefix: String,
}

/// The template cannot make a job.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// The engine command names a placeholder that does not exist.
    #[error("engine command: unknown placeholder {{{name}}} (known: {})", PLACEHOLDERS.iter().map(|p| format!("{{{p}}}")).collect::<Vec<_>>().join(", "))]
    UnknownPlaceholder {
        /// The name between the braces.
        name: String,
    },
    /// A `{` without its `}`, or a lone `}`.
    #[error("engine command: unbalanced brace at byte {at} (write {{{{ or }}}} for a literal brace)")]
    Unbalanced {
        /// Where.
        at: usize,
    },
    /// The walltime leaves no time to serve.
    #[error("walltime {walltime:?} is not longer than the drain window {drain_window:?} plus {DRAIN_SIGNAL_SLACK:?}")]
    WalltimeTooShort {
        /// The walltime asked for.
        walltime: Duration,
        /// The drain window.
        drain_window: Duration,
    },
    /// No gateway to join.
    #[error("no gateway to join: give the template at least one HOST:PORT")]
    NoJoin,
    /// A value would break the script (a newline or NUL), or a variable name is not one.
    #[error("{what} '{value}' cannot go into a batch script: {why}")]
    BadValue {
        /// Which input.
        what: &'static str,
        /// The value (shortened).
        value: String,
        /// Why.
        why: &'static str,
    },
}

impl JobTemplate {
    /// A template with the defaults: 15-minute drain window, 8 CPUs, working directory `/tmp`,
    /// the cluster's default partition, job names `tela-<model>`.
    pub fn new(
        tela_bin: impl Into<String>,
        join: Vec<String>,
        join_secret_file: impl Into<String>,
        engine_cmd: impl Into<String>,
    ) -> JobTemplate {
        JobTemplate {
            tela_bin: tela_bin.into(),
            join,
            join_secret_file: join_secret_file.into(),
            engine_cmd: engine_cmd.into(),
            engine_port: None,
            drain_window: Duration::from_secs(15 * 60),
            time_min: None,
            partition: None,
            account: None,
            qos: None,
            cpus_per_task: 8,
            working_dir: "/tmp".into(),
            environment: Vec::new(),
            name_prefix: "tela".into(),
        }
    }

    /// The job that serves `model` on `placement` for `walltime`.
    pub fn render(&self, model: &str, placement: &Placement, walltime: Duration) -> Result<JobRequest, TemplateError> {
        if self.join.is_empty() {
            return Err(TemplateError::NoJoin);
        }
        if walltime <= self.drain_window + DRAIN_SIGNAL_SLACK {
            return Err(TemplateError::WalltimeTooShort { walltime, drain_window: self.drain_window });
        }
        check_value("model", model)?;
        check_value("tela binary", &self.tela_bin)?;
        check_value("join-secret file", &self.join_secret_file)?;
        check_value("working directory", &self.working_dir)?;
        for j in &self.join {
            check_value("join address", j)?;
        }
        for (k, v) in &self.environment {
            check_name(k)?;
            check_value("environment value", v)?;
        }
        let gpus_per_node = if placement.hardware.gpu_count > 0 { u32::from(placement.tensor_parallel) } else { 0 };
        let engine = self.engine_command(model, placement)?;
        let mut job_env = vec![
            ("TELA_JOIN".to_string(), self.join.join(",")),
            ("TELA_JOIN_SECRET_FILE".to_string(), self.join_secret_file.clone()),
            ("TELA_DRAIN_WINDOW".to_string(), format!("{}s", self.drain_window.as_secs())),
        ];
        job_env.extend(self.environment.iter().cloned());
        Ok(JobRequest {
            name: job_name(&self.name_prefix, model),
            script: self.script(model, placement, &engine, &job_env),
            partition: self.partition.clone(),
            account: self.account.clone(),
            qos: self.qos.clone(),
            nodes: placement.pipeline_stages.max(1),
            gpus_per_node,
            cpus_per_task: self.cpus_per_task.max(1),
            walltime,
            time_min: self.time_min.map(|m| m.min(walltime)),
            drain_signal_before: self.drain_window + DRAIN_SIGNAL_SLACK,
            working_dir: self.working_dir.clone(),
            // The script sets Tela's variables itself; the job's environment carries nothing
            // beyond what the backend passes, so both backends run the same job.
            environment: Vec::new(),
        })
    }

    /// The engine command with its placeholders filled in (still a shell command).
    pub fn engine_command(&self, model: &str, placement: &Placement) -> Result<String, TemplateError> {
        check_value("engine command", &self.engine_cmd)?;
        let value = |name: &str| -> Option<String> {
            Some(match name {
                "model" => sh_quote(model),
                "variant" => sh_quote(&placement.variant.label),
                "port" => "\"$TELA_ENGINE_PORT\"".to_string(),
                "tp" => placement.tensor_parallel.to_string(),
                "pp" => placement.pipeline_stages.to_string(),
                "gpus" => placement.gpus().to_string(),
                _ => return None,
            })
        };
        let text = &self.engine_cmd;
        let mut out = String::with_capacity(text.len() + 32);
        let mut rest = text.char_indices().peekable();
        while let Some((i, c)) = rest.next() {
            match c {
                '{' if rest.peek().map(|&(_, n)| n) == Some('{') => {
                    rest.next();
                    out.push('{');
                }
                '}' if rest.peek().map(|&(_, n)| n) == Some('}') => {
                    rest.next();
                    out.push('}');
                }
                '{' => {
                    let close = text[i..].find('}').ok_or(TemplateError::Unbalanced { at: i })?;
                    let name = &text[i + 1..i + close];
                    if name.contains('{') {
                        return Err(TemplateError::Unbalanced { at: i });
                    }
                    out.push_str(&value(name).ok_or_else(|| TemplateError::UnknownPlaceholder { name: name.into() })?);
                    while rest.peek().is_some_and(|&(j, _)| j <= i + close) {
                        rest.next();
                    }
                }
                '}' => return Err(TemplateError::Unbalanced { at: i }),
                c => out.push(c),
            }
        }
        Ok(out)
    }

    fn script(&self, model: &str, placement: &Placement, engine: &str, env: &[(String, String)]) -> String {
        let mut s = String::new();
        s.push_str("#!/bin/bash\n");
        s.push_str(&format!("# A Tela serving node for model {}, rendered by Tela's job template.\n", sh_quote(model)));
        s.push_str(&format!("# Placement: {}\n", one_line(&placement.to_string())));
        if let Some(min) = self.time_min {
            s.push_str(&format!(
                "# Backfill job: --time-min={}s; Slurm may start it with a shorter limit, which the node reads.\n",
                min.as_secs()
            ));
        }
        s.push_str("set -u\n");
        for (k, v) in env {
            s.push_str(&format!("export {k}={}\n", sh_quote(v)));
        }
        s.push_str(&format!("TELA={}\n", sh_quote(&self.tela_bin)));
        s.push_str(
            "# A directory of this job's own: its node identity must not be shared with other jobs.\n\
             TELA_JOB_DIR=\"${TMPDIR:-/tmp}/tela-job-${SLURM_JOB_ID:?not inside a Slurm job}\"\n\
             mkdir -p -m 700 \"$TELA_JOB_DIR\" || exit 1\n\
             trap 'rm -rf \"$TELA_JOB_DIR\"' EXIT\n\
             export TELA_IDENTITY=\"$TELA_JOB_DIR/identity.key\"\n",
        );
        match self.engine_port {
            Some(port) => s.push_str(&format!("export TELA_ENGINE_PORT={port}\n")),
            None => s.push_str(&format!(
                "TELA_ENGINE_PORT=$(\"$TELA\" node --print-free-port $(( {ENGINE_PORT_BASE} + SLURM_JOB_ID % {ENGINE_PORT_SPAN} ))) \\\n\
                 \x20   || {{ echo \"tela: no free port for the engine\" >&2; exit 1; }}\n\
                 export TELA_ENGINE_PORT\n"
            )),
        }
        s.push_str("export TELA_BACKEND_URL=\"http://127.0.0.1:$TELA_ENGINE_PORT\"\n");
        // The engine ignores SIGUSR1 (see the module docs); `exec` keeps it the node's child.
        s.push_str(&format!("ENGINE_CMD={}\n", sh_quote(&format!("trap '' USR1; exec {engine}"))));
        s.push_str(
            "\n\
             NODE_ID=$(\"$TELA\" node --print-id) || { echo \"tela: cannot create the node identity in $TELA_JOB_DIR\" >&2; exit 1; }\n\
             echo \"tela: job $SLURM_JOB_ID is node $NODE_ID\"\n\
             scontrol update JobId=\"$SLURM_JOB_ID\" Comment=\"tela-node=$NODE_ID\" \\\n\
             \x20   || echo \"tela: cannot set the job comment; the spinner will not see which node this job is\" >&2\n\
             \n\
             # Pass Slurm's warning, a drain (SIGUSR1) and scancel (SIGTERM) on to the node; a signal\n\
             # that comes before the node has started is passed on as soon as it has.\n\
             NODE=\n\
             PENDING=\n\
             forward() { echo \"tela: SIG$1 received, passing it to tela node\"; PENDING=$1; [ -n \"$NODE\" ] && kill -\"$1\" \"$NODE\" 2>/dev/null; }\n\
             trap 'forward USR1' USR1\n\
             trap 'forward TERM' TERM\n\
             \"$TELA\" node --engine-cmd \"$ENGINE_CMD\" &\n\
             NODE=$!\n\
             [ -n \"$PENDING\" ] && kill -\"$PENDING\" \"$NODE\" 2>/dev/null\n\
             # `wait` returns early when a trapped signal arrives: wait again until the node is gone.\n\
             while kill -0 \"$NODE\" 2>/dev/null; do wait \"$NODE\"; done\n\
             wait \"$NODE\"\n\
             status=$?\n\
             echo \"tela: tela node exited with status $status\"\n\
             exit \"$status\"\n",
        );
        s
    }
}

/// `prefix-model`, with what Slurm or a shell would mind replaced by `_`, at most 64 bytes.
fn job_name(prefix: &str, model: &str) -> String {
    let name: String = format!("{prefix}-{model}")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '_' })
        .take(64)
        .collect();
    name
}

/// `s` in single quotes, safe in any shell word position.
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

fn check_value(what: &'static str, value: &str) -> Result<(), TemplateError> {
    let bad = |why| Err(TemplateError::BadValue { what, value: value.chars().take(60).collect(), why });
    if value.is_empty() {
        return bad("it is empty");
    }
    if value.contains(['\n', '\r', '\0']) {
        return bad("it contains a line break or NUL");
    }
    Ok(())
}

fn check_name(name: &str) -> Result<(), TemplateError> {
    let ok = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(TemplateError::BadValue {
            what: "environment variable name",
            value: name.into(),
            why: "use letters, digits and _",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tela_core::placement::Variant;
    use tela_core::{GpuModel, Hardware, Quantization};

    fn placement(tp: u8, stages: u32) -> Placement {
        Placement {
            shape: 0,
            shape_name: "a100".into(),
            hardware: Hardware::catalog(GpuModel::A100_80, 4),
            tensor_parallel: tp,
            pipeline_stages: stages,
            variant: Variant::new("awq", Quantization::Awq),
            quantized_fallback: true,
            need_mib: 40_000,
        }
    }

    fn template() -> JobTemplate {
        let mut t = JobTemplate::new(
            "/opt/tela/bin/tela",
            vec!["gw1.example.org:7000".into(), "gw2.example.org:7000".into()],
            "/home/svc/.tela/secret",
            "vllm serve {model} --quantization {variant} --port {port} -tp {tp} -pp {pp} # {gpus} GPUs {{x}}",
        );
        t.partition = Some("gpu".into());
        t.account = Some("proj".into());
        t.environment = vec![("HF_HOME".into(), "/scratch/hf cache".into())];
        t.drain_window = Duration::from_secs(600);
        t.working_dir = "/scratch/tela".into();
        t
    }

    #[test]
    fn a_job_asks_for_the_placement_and_runs_the_node() {
        let job =
            template().render("org/llama's-70b", &placement(4, 2), Duration::from_secs(3 * 3600)).expect("renders");
        assert_eq!(job.name, "tela-org_llama_s-70b");
        assert_eq!((job.nodes, job.gpus_per_node, job.cpus_per_task), (2, 4, 8));
        assert_eq!(job.walltime, Duration::from_secs(3 * 3600));
        assert_eq!(job.drain_signal_before, Duration::from_secs(660));
        assert_eq!((job.partition.as_deref(), job.account.as_deref()), (Some("gpu"), Some("proj")));
        assert_eq!(job.working_dir, "/scratch/tela");
        let s = &job.script;
        assert!(s.starts_with("#!/bin/bash\n"));
        for line in [
            "export TELA_JOIN='gw1.example.org:7000,gw2.example.org:7000'",
            "export TELA_JOIN_SECRET_FILE='/home/svc/.tela/secret'",
            "export TELA_DRAIN_WINDOW='600s'",
            "export HF_HOME='/scratch/hf cache'",
            "TELA='/opt/tela/bin/tela'",
            "export TELA_IDENTITY=\"$TELA_JOB_DIR/identity.key\"",
            "TELA_ENGINE_PORT=$(\"$TELA\" node --print-free-port $(( 20000 + SLURM_JOB_ID % 10000 )))",
            "export TELA_ENGINE_PORT",
            "NODE_ID=$(\"$TELA\" node --print-id)",
            "scontrol update JobId=\"$SLURM_JOB_ID\" Comment=\"tela-node=$NODE_ID\" \\",
            "trap 'forward USR1' USR1",
            "trap 'forward TERM' TERM",
            "\"$TELA\" node --engine-cmd \"$ENGINE_CMD\" &",
        ] {
            assert!(s.lines().any(|l| l.starts_with(line)), "missing line {line:?} in\n{s}");
        }
        assert!(s.contains("tela-job-${SLURM_JOB_ID"), "the identity is per job:\n{s}");
        let engine = template().engine_command("org/llama's-70b", &placement(4, 2)).expect("renders");
        assert_eq!(
            engine,
            "vllm serve 'org/llama'\\''s-70b' --quantization 'awq' --port \"$TELA_ENGINE_PORT\" -tp 4 -pp 2 # 8 GPUs {x}"
        );
    }

    #[test]
    fn a_backfill_job_carries_its_least_time_never_above_its_limit() {
        let mut t = template();
        let plain = t.render("m", &placement(1, 1), Duration::from_secs(3600)).expect("renders");
        assert_eq!(plain.time_min, None);
        assert!(!plain.script.contains("--time-min"));
        t.time_min = Some(Duration::from_secs(900));
        let short = t.render("m", &placement(1, 1), Duration::from_secs(1800)).expect("renders");
        assert_eq!((short.walltime, short.time_min), (Duration::from_secs(1800), Some(Duration::from_secs(900))));
        assert!(short.script.contains("# Backfill job: --time-min=900s"), "{}", short.script);
        let capped = t.render("m", &placement(1, 1), Duration::from_secs(700 + 60)).expect("renders");
        assert_eq!(capped.time_min, Some(Duration::from_secs(760)), "never above the walltime");
    }

    #[test]
    fn a_fixed_engine_port_and_cpu_shapes() {
        let mut t = template();
        t.engine_port = Some(8000);
        let mut p = placement(1, 1);
        p.hardware = Hardware::CPU;
        let job = t.render("m", &p, Duration::from_secs(3600)).expect("renders");
        assert_eq!(job.gpus_per_node, 0);
        assert!(job.script.lines().any(|l| l == "export TELA_ENGINE_PORT=8000"));
    }

    #[test]
    fn mistakes_are_typed_errors() {
        let p = placement(1, 1);
        let hour = Duration::from_secs(3600);
        let mut t = template();
        t.engine_cmd = "serve {model} --port {prot}".into();
        let err = t.render("m", &p, hour).unwrap_err();
        assert_eq!(err, TemplateError::UnknownPlaceholder { name: "prot".into() });
        assert!(err.to_string().contains("{port}"), "{err}");
        for (cmd, at) in [("serve {model", 6), ("serve model}", 11), ("a {b{c}", 2)] {
            t.engine_cmd = cmd.into();
            assert_eq!(t.render("m", &p, hour).unwrap_err(), TemplateError::Unbalanced { at }, "{cmd}");
        }
        let t = template();
        assert!(matches!(t.render("m", &p, Duration::from_secs(600)), Err(TemplateError::WalltimeTooShort { .. })));
        assert!(matches!(t.render("m\nrm -rf /", &p, hour), Err(TemplateError::BadValue { what: "model", .. })));
        let mut t = template();
        t.join.clear();
        assert_eq!(t.render("m", &p, hour).unwrap_err(), TemplateError::NoJoin);
        let mut t = template();
        t.environment.push(("BAD-NAME".into(), "x".into()));
        assert!(matches!(t.render("m", &p, hour), Err(TemplateError::BadValue { .. })));
    }

    #[test]
    fn quoting_survives_a_shell() {
        for s in ["plain", "it's", "$(reboot)", "a b\tc", "'''"] {
            let out = std::process::Command::new("sh").arg("-c").arg(format!("printf %s {}", sh_quote(s))).output();
            let Ok(out) = out else { return };
            assert_eq!(String::from_utf8_lossy(&out.stdout), s);
        }
    }
}
