//! Starting the processes of a load tool's run on loopback — engine simulators, gateways, nodes
//! — and ending them all when the run ends, however it ends.
//!
//! Every process goes into a [`Procs`], which kills and reaps them when dropped; the run's
//! identities, sockets and key files live in a [`TempDir`], removed when dropped. [`Tela`]
//! starts `tela` roles the way every tool does: on loopback, ports picked by the system and read
//! back from the first lines the process prints.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::client::Result;

/// Children killed (and reaped) on drop.
#[derive(Default)]
pub struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Procs {
    /// Starts a process, its stderr discarded; returns its pid and its stdout's first `lines`
    /// lines (trimmed).
    pub fn spawn(&mut self, cmd: &mut Command, lines: usize) -> Result<(u32, Vec<String>)> {
        // A pipe nobody reads fills up and blocks the child: only pipe what is read.
        let stdout = if lines > 0 { Stdio::piped() } else { Stdio::null() };
        let mut child = cmd.stdin(Stdio::null()).stdout(stdout).stderr(Stdio::null()).spawn()?;
        let pid = child.id();
        let mut out = Vec::new();
        if lines > 0 {
            let mut reader = BufReader::new(child.stdout.take().ok_or("no stdout")?);
            for _ in 0..lines {
                let mut line = String::new();
                reader.read_line(&mut line)?;
                out.push(line.trim().to_string());
            }
            // Keep reading (and discarding) so that the child never blocks on a full pipe.
            std::thread::spawn(move || for _ in reader.lines() {});
        }
        self.0.push(child);
        Ok((pid, out))
    }

    /// Kills and reaps the process `pid` (one this started).
    pub fn stop(&mut self, pid: u32) {
        if let Some(i) = self.0.iter().position(|c| c.id() == pid) {
            let mut c = self.0.remove(i);
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A run's temporary directory (`<tmp>/<name>-<pid>`), removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates `<tmp>/<name>-<this process's id>`.
    pub fn new(name: &str) -> Result<TempDir> {
        let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(TempDir(dir))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The address in a `listening on http://ADDR` line (engine simulators' and gateways' first).
pub fn listening_on(line: &str) -> Result<SocketAddr> {
    let addr = line.strip_prefix("listening on http://").ok_or_else(|| format!("unexpected output: {line:?}"))?;
    Ok(addr.parse()?)
}

/// A port free on loopback now (for programs that cannot pick their own).
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// vllm-router: the one `benches/setup-vllm-router.sh` installs, else the one on `PATH`.
pub fn find_vllm_router() -> Option<PathBuf> {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.ci/cache/bench-venv/bin/vllm-router");
    if venv.exists() {
        return Some(venv);
    }
    let out = Command::new("sh").args(["-c", "command -v vllm-router"]).output().ok()?;
    out.status.success().then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// A gateway started by [`Tela::gateway`].
pub struct Gateway {
    /// Its process id.
    pub pid: u32,
    /// Where its HTTP API listens.
    pub api: SocketAddr,
    /// Where nodes (and other gateways) join it.
    pub anchor: String,
}

/// The `tela` binary, and what the processes of one run share: a directory for their files and
/// the join secret.
pub struct Tela {
    /// The `tela` executable.
    pub bin: PathBuf,
    /// Where identities, control sockets and key files go.
    pub dir: PathBuf,
    /// The federation's join secret.
    pub secret: String,
}

impl Tela {
    /// `dir/name`, as a string for a flag's value.
    pub fn file(&self, name: &str) -> String {
        self.dir.join(name).to_string_lossy().into_owned()
    }

    /// Starts `tela engine-sim --port 0` with `flags`; its address.
    pub fn engine_sim(&self, procs: &mut Procs, flags: &[&str]) -> Result<SocketAddr> {
        let (_, lines) = procs.spawn(Command::new(&self.bin).args(["engine-sim", "--port", "0"]).args(flags), 1)?;
        listening_on(&lines[0])
    }

    /// Starts `tela gateway` on loopback (API and anchor on free ports) with the identity
    /// `dir/<name>.key`, logging warnings only, and `flags`.
    pub fn gateway(&self, procs: &mut Procs, name: &str, flags: &[&str]) -> Result<Gateway> {
        let (pid, lines) = procs.spawn(
            Command::new(&self.bin)
                .args(["gateway", "--listen", "127.0.0.1:0", "--anchor-listen", "127.0.0.1:0"])
                .args(["--identity", &self.file(&format!("{name}.key"))])
                .args(flags)
                .env("TELA_JOIN_SECRET", &self.secret)
                .env("RUST_LOG", "warn"),
            2,
        )?;
        let api = listening_on(&lines[0])?;
        let anchor = lines[1].strip_prefix("anchor on ").ok_or("unexpected gateway output")?.to_string();
        Ok(Gateway { pid, api, anchor })
    }

    /// Starts `tela node` in front of the engine at `backend` (a URL), joining every anchor in
    /// `join`, with the identity `dir/<name>.key` and control socket `dir/<name>.sock`, and
    /// `flags`; its pid.
    pub fn node(&self, procs: &mut Procs, name: &str, join: &[&str], backend: &str, flags: &[&str]) -> Result<u32> {
        let mut cmd = Command::new(&self.bin);
        cmd.arg("node");
        for anchor in join {
            cmd.args(["--join", anchor]);
        }
        cmd.args(["--backend-url", backend])
            .args(flags)
            .args(["--identity", &self.file(&format!("{name}.key"))])
            .args(["--control", &self.file(&format!("{name}.sock"))])
            .env("TELA_JOIN_SECRET", &self.secret)
            .env("RUST_LOG", "warn");
        Ok(procs.spawn(&mut cmd, 0)?.0)
    }

    /// The key-file line of `key` (named `name`, when given), from `tela gateway hash-key`.
    pub fn hash_key(&self, key: &str, name: Option<&str>) -> Result<String> {
        let mut cmd = Command::new(&self.bin);
        cmd.args(["gateway", "hash-key"]);
        if let Some(name) = name {
            cmd.args(["--name", name]);
        }
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()?;
        child.stdin.take().ok_or("stdin")?.write_all(format!("{key}\n").as_bytes())?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            return Err("tela gateway hash-key failed".into());
        }
        Ok(String::from_utf8(out.stdout)?)
    }
}

/// `Ok` when the `tela` executable at `path` exists; otherwise an error that says how to build it.
pub fn require_tela(path: &Path) -> Result<()> {
    if path.exists() {
        return Ok(());
    }
    Err(format!("{} not found: cargo build --release -p tela-gateway, or pass --tela", path.display()).into())
}
