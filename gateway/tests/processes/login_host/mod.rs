//! What the tests of nodes behind a login host start: an OpenSSH `sshd` of their own (its
//! own config, host key and authorized key in a temporary directory; the system's sshd
//! configuration is not touched), `tela relay`, `tela node` children that reach their gateway
//! only `--via-ssh` or `--relay`, optionally inside a network namespace, and the `ssh` children
//! those nodes spawn.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{tela, ChildGuard, NodeProc, SECRET};
use tela_transports::Identity;

/// The `sshd` binary: `TELA_SSHD` (what `.ci/setup-sshd.sh` prints), else Debian's path.
pub fn sshd_bin() -> String {
    std::env::var("TELA_SSHD").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| "/usr/sbin/sshd".into())
}

/// Runs `argv` inside the network namespace `netns` (`ip netns exec`), or as it is.
pub fn command_in(netns: Option<&str>, program: &str) -> Command {
    match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, program]);
            c
        }
        None => Command::new(program),
    }
}

/// A running `sshd` that lets this test's user in with a key of its own.
pub struct Sshd {
    _child: ChildGuard,
    /// Where it listens.
    pub addr: SocketAddr,
    /// `--ssh-command` for a node: the key, the port, a known-hosts file of its own, and no
    /// user or system ssh configuration.
    pub ssh_command: String,
    /// `user@host` for `--via-ssh`.
    pub destination: String,
    /// Its log.
    pub log: PathBuf,
}

fn run(cmd: &mut Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    assert!(out.status.success(), "{what} failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// Starts `sshd` on `addr` (inside `netns` if given) with keys and config in `dir`, and waits
/// until it accepts connections.
pub fn start_sshd(dir: &Path, addr: SocketAddr, netns: Option<&str>) -> Sshd {
    let bin = sshd_bin();
    assert!(
        Path::new(&bin).exists(),
        "sshd not found at {bin}: run .ci/setup-sshd.sh (as root it installs openssh-server) and export what it prints"
    );
    let dir = dir.join("sshd");
    std::fs::create_dir_all(&dir).expect("sshd dir");
    for key in ["host_key", "user_key"] {
        let path = dir.join(key);
        if !path.exists() {
            run(
                Command::new("ssh-keygen").args(["-q", "-t", "ed25519", "-N", "", "-C", "tela-test", "-f"]).arg(&path),
                "ssh-keygen",
            );
        }
    }
    std::fs::copy(dir.join("user_key.pub"), dir.join("authorized_keys")).expect("authorized_keys");
    // sshd insists on its privilege-separation directory even when it runs as this user.
    let _ = std::fs::create_dir_all("/run/sshd");
    let user = String::from_utf8(Command::new("id").arg("-un").output().expect("id").stdout).expect("utf-8");
    let user = user.trim().to_string();
    let config = dir.join("sshd_config");
    std::fs::write(
        &config,
        format!(
            "ListenAddress {addr}\nHostKey {host}\nAuthorizedKeysFile {keys}\nPidFile none\nUsePAM no\n\
             PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\n\
             PermitRootLogin prohibit-password\nStrictModes no\nAllowTcpForwarding yes\nAllowUsers {user}\n\
             LogLevel VERBOSE\n",
            host = dir.join("host_key").display(),
            keys = dir.join("authorized_keys").display(),
        ),
    )
    .expect("sshd_config");
    let log = dir.join("sshd.log");
    let child = command_in(netns, &bin)
        .args(["-D", "-e", "-f"])
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("sshd log"))
        .spawn()
        .expect("start sshd");
    let mut child = ChildGuard(child);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if std::fs::read_to_string(&log).unwrap_or_default().contains("Server listening") {
            break;
        }
        if let Ok(Some(status)) = child.0.try_wait() {
            panic!("sshd exited ({status}): {}", std::fs::read_to_string(&log).unwrap_or_default());
        }
        assert!(
            Instant::now() < deadline,
            "sshd did not listen within 15 s: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let ssh_command = format!(
        "ssh -F /dev/null -i {key} -p {port} -o IdentitiesOnly=yes -o UserKnownHostsFile={known} \
         -o StrictHostKeyChecking=accept-new -o LogLevel=ERROR",
        key = dir.join("user_key").display(),
        port = addr.port(),
        known = dir.join("known_hosts").display(),
    );
    Sshd { _child: child, addr, ssh_command, destination: format!("{user}@{}", addr.ip()), log }
}

/// `tela relay` on `listen` allowing `allow`, inside `netns` if given; returns once it listens.
pub fn start_relay(dir: &Path, listen: &str, allow: &[String], netns: Option<&str>) -> (ChildGuard, String) {
    use std::io::BufRead;
    let mut cmd = command_in(netns, tela());
    cmd.args(["relay", "--listen", listen]);
    for a in allow {
        cmd.args(["--allow", a]);
    }
    let mut child = cmd
        .env_remove("TELA_RELAY_ALLOW")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("relay.log")).expect("relay log"))
        .spawn()
        .expect("start tela relay");
    let mut stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let child = ChildGuard(child);
    let mut line = String::new();
    stdout.read_line(&mut line).expect("read the relay's first line");
    let addr = line.trim().strip_prefix("relay on ").unwrap_or_else(|| panic!("unexpected: {line:?}")).to_string();
    (child, addr)
}

/// `tela node` joining `join` over `path_args` (`--via-ssh ...` or `--relay ...`), in front
/// of the engine at `engine`, inside `netns` if given.
pub fn spawn_node_via(
    dir: &Path,
    name: &str,
    join: &str,
    engine: &str,
    path_args: &[&str],
    netns: Option<&str>,
) -> NodeProc {
    let key = dir.join(format!("{name}.key"));
    let id = Identity::load_or_create(&key).expect("node identity").node_id();
    let control = dir.join(format!("{name}.sock"));
    let log = dir.join(format!("{name}.log"));
    let child = command_in(netns, tela())
        .arg("node")
        .args(["--join", join])
        .args(["--backend-url", &format!("http://{engine}")])
        .args(["--identity", key.to_str().expect("utf-8 path")])
        .args(["--control", control.to_str().expect("utf-8 path")])
        .args(["--probe-interval", "200ms", "--drain-window", "20s"])
        .args(path_args)
        .env("TELA_JOIN_SECRET", SECRET)
        .env("RUST_LOG", "info,tela_runtime::ssh=debug")
        .env_remove("TELA_JOIN")
        .env_remove("TELA_RELAY")
        .env_remove("TELA_VIA_SSH")
        .env_remove("TELA_SSH_COMMAND")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("start tela node");
    NodeProc::from_parts(id, control, log, child)
}

/// Process ids of the children of `parent` whose command name is `name`.
pub fn children_named(parent: u32, name: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
            // pid (comm) state ppid ...
            let Some((comm_part, rest)) = stat.rsplit_once(')') else { return false };
            let comm = comm_part.split_once('(').map_or("", |(_, c)| c);
            let ppid = rest.split_whitespace().nth(1).and_then(|p| p.parse::<u32>().ok());
            comm == name && ppid == Some(parent)
        })
        .collect()
}

/// Whether process `pid` is a zombie (exited, not reaped by its parent).
pub fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('Z')))
        .unwrap_or(false)
}

/// Three network namespaces — "compute" reaches only "login", "gateway" is reached from
/// "login" and from this (the root) namespace, and "login" forwards nothing — removed on drop.
pub struct Namespaces {
    /// Namespace names.
    pub compute: String,
    pub login: String,
    pub gateway: String,
    /// The compute node's side of its link to login.
    pub compute_ip: String,
    /// Login's address on the compute link (sshd, relay).
    pub login_ip: String,
    /// The gateway's address on the login link (its anchor).
    pub gateway_anchor_ip: String,
    /// The gateway's address on the link to this namespace (its API).
    pub gateway_api_ip: String,
}

/// Why the namespaces could not be built (no root, no `ip`, no veth support). Whatever was
/// built before the failure is removed again.
#[derive(Debug, thiserror::Error)]
pub enum NamespacesError {
    /// The `ip` command could not be started.
    #[error("cannot run ip: {0}")]
    NoIp(#[source] std::io::Error),
    /// One `ip` step exited with failure.
    #[error("ip {} failed: {stderr}", args.join(" "))]
    Step {
        /// Its arguments.
        args: Vec<String>,
        /// What it printed on stderr, trimmed.
        stderr: String,
    },
}

impl Namespaces {
    /// Builds them; `Err` says what failed.
    pub fn create() -> Result<Namespaces, NamespacesError> {
        let pid = std::process::id();
        let net = 100 + pid % 100;
        let ns = |role: &str| format!("tela-{role}-{pid}");
        let n = Namespaces {
            compute: ns("c"),
            login: ns("l"),
            gateway: ns("g"),
            compute_ip: format!("10.{net}.1.2"),
            login_ip: format!("10.{net}.1.1"),
            gateway_anchor_ip: format!("10.{net}.2.2"),
            gateway_api_ip: format!("10.{net}.3.2"),
        };
        let root_side = format!("tela-r{}", pid % 100_000);
        let root_ip = format!("10.{net}.3.1");
        let (c, l, g) = (n.compute.clone(), n.login.clone(), n.gateway.clone());
        let steps: Vec<Vec<String>> = vec![
            vec!["netns", "add", &c],
            vec!["netns", "add", &l],
            vec!["netns", "add", &g],
            vec!["-n", &c, "link", "add", "to-login", "type", "veth", "peer", "name", "to-compute", "netns", &l],
            vec!["-n", &l, "link", "add", "to-gateway", "type", "veth", "peer", "name", "to-login", "netns", &g],
            vec!["link", "add", &root_side, "type", "veth", "peer", "name", "to-root", "netns", &g],
            vec!["-n", &c, "addr", "add", &format!("{}/24", n.compute_ip), "dev", "to-login"],
            vec!["-n", &l, "addr", "add", &format!("{}/24", n.login_ip), "dev", "to-compute"],
            vec!["-n", &l, "addr", "add", &format!("10.{net}.2.1/24"), "dev", "to-gateway"],
            vec!["-n", &g, "addr", "add", &format!("{}/24", n.gateway_anchor_ip), "dev", "to-login"],
            vec!["-n", &g, "addr", "add", &format!("{}/24", n.gateway_api_ip), "dev", "to-root"],
            vec!["addr", "add", &format!("{root_ip}/24"), "dev", &root_side],
            vec!["-n", &c, "link", "set", "lo", "up"],
            vec!["-n", &c, "link", "set", "to-login", "up"],
            vec!["-n", &l, "link", "set", "lo", "up"],
            vec!["-n", &l, "link", "set", "to-compute", "up"],
            vec!["-n", &l, "link", "set", "to-gateway", "up"],
            vec!["-n", &g, "link", "set", "lo", "up"],
            vec!["-n", &g, "link", "set", "to-login", "up"],
            vec!["-n", &g, "link", "set", "to-root", "up"],
            vec!["link", "set", &root_side, "up"],
        ]
        .into_iter()
        .map(|s| s.into_iter().map(|a| a.to_string()).collect())
        .collect();
        for step in steps {
            let out = Command::new("ip").args(&step).output().map_err(NamespacesError::NoIp)?;
            if !out.status.success() {
                let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
                return Err(NamespacesError::Step { args: step, stderr });
            }
        }
        // Login routes nothing between its links (a new namespace starts with forwarding off;
        // set it anyway, in case the host's defaults say otherwise).
        let _ = Command::new("ip").args(["netns", "exec", &l, "sysctl", "-qw", "net.ipv4.ip_forward=0"]).output();
        Ok(n)
    }

    /// Whether a TCP connection from namespace `from` to `addr` succeeds within two seconds.
    pub fn can_connect(from: &str, addr: &str) -> bool {
        let (host, port) = addr.rsplit_once(':').expect("host:port");
        Command::new("ip")
            .args(["netns", "exec", from, "timeout", "2", "bash", "-c", &format!("exec 3<>/dev/tcp/{host}/{port}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        // Deleting a namespace removes its veth ends, and with them their peers.
        for ns in [&self.compute, &self.login, &self.gateway] {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}
