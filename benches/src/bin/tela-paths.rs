//! `tela-paths`: what the login-host paths cost, on loopback. The latency a node's tunnel adds
//! when it goes through the login host's `ssh -W` (`tela node --via-ssh`) or through `tela
//! relay` (`--relay`), against the same node dialling the gateway directly over TCP+TLS; and
//! how long a node behind ssh takes to be routable again after its ssh connection is cut.
//!
//! One run starts one engine simulator (no time to first token, a million tokens per second,
//! so that what is measured is the path), `tela gateway`, an `sshd` of its own (its own
//! config, host key and user key in a temporary directory; as the user running the tool) and
//! `tela relay`; then, one at a time, a node over each path. For each path it sends
//! `--requests` chat requests one after another on one keep-alive connection to the gateway,
//! streamed and not, and prints p50/p99 of request-to-last-byte and their ratio to the direct
//! tunnel's. Then it kills the ssh child of the node `--cuts` times and measures, each time,
//! from the kill to the first request the node answers again. Every process started is killed
//! on exit; nothing leaves loopback.
//!
//! ```text
//! cargo build --release -p tela-gateway -p tela-benches --bin tela --bin tela-paths
//! target/release/tela-paths [--tela PATH] [--sshd PATH] [--requests N] [--cuts N]
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http1::SendRequest;
use tela_benches::client::{chat_ok, connect, percentile_ms as pct, serving_nodes as serving, short_chat, Result};
use tela_benches::process::{free_port, Procs, Tela, TempDir};

const MODEL: &str = "bench";
const SECRET: &str = "tela-paths benchmark secret";

struct Args {
    tela: PathBuf,
    sshd: PathBuf,
    requests: usize,
    cuts: usize,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        tela: PathBuf::from("target/release/tela"),
        sshd: PathBuf::from("/usr/sbin/sshd"),
        requests: 1000,
        cuts: 5,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--tela" => args.tela = PathBuf::from(value()?),
            "--sshd" => args.sshd = PathBuf::from(value()?),
            "--requests" => args.requests = value()?.parse()?,
            "--cuts" => args.cuts = value()?.parse()?,
            _ => return Err(format!("unknown argument {a} (see the doc comment of tela-paths.rs)").into()),
        }
    }
    Ok(args)
}

/// One chat request on `sender`; `true` when it was answered 200 with a body.
async fn request(sender: &mut SendRequest<Full<Bytes>>, addr: SocketAddr, stream: bool) -> bool {
    chat_ok(sender, addr, None, short_chat(MODEL, stream), Duration::from_secs(5)).await
}

/// `requests` requests one after another; sorted latencies and the error count.
async fn measure(gateway: SocketAddr, stream: bool, requests: usize) -> Result<(Vec<Duration>, usize)> {
    let mut sender = connect(gateway).await?;
    // Warm up the path (connection, TLS session, engine).
    for _ in 0..20 {
        request(&mut sender, gateway, stream).await;
    }
    let mut lat = Vec::with_capacity(requests);
    let mut errors = 0;
    for _ in 0..requests {
        let t0 = Instant::now();
        if request(&mut sender, gateway, stream).await {
            lat.push(t0.elapsed());
        } else {
            errors += 1;
            sender = connect(gateway).await?;
        }
    }
    lat.sort();
    Ok((lat, errors))
}

/// Starts an sshd on loopback that lets this user in with a key of its own; returns the
/// `--via-ssh` destination and `--ssh-command`.
fn start_sshd(procs: &mut Procs, sshd: &Path, dir: &Path) -> Result<(String, String)> {
    for key in ["host_key", "user_key"] {
        let status = Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", "tela-paths", "-f"])
            .arg(dir.join(key))
            .status()?;
        if !status.success() {
            return Err("ssh-keygen failed".into());
        }
    }
    std::fs::copy(dir.join("user_key.pub"), dir.join("authorized_keys"))?;
    let _ = std::fs::create_dir_all("/run/sshd");
    let user = String::from_utf8(Command::new("id").arg("-un").output()?.stdout)?.trim().to_string();
    let port = free_port()?;
    let config = dir.join("sshd_config");
    std::fs::write(
        &config,
        format!(
            "ListenAddress 127.0.0.1:{port}\nHostKey {}\nAuthorizedKeysFile {}\nPidFile none\nUsePAM no\n\
             PasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n\
             StrictModes no\nAllowTcpForwarding yes\nAllowUsers {user}\n",
            dir.join("host_key").display(),
            dir.join("authorized_keys").display()
        ),
    )?;
    procs.spawn(Command::new(sshd).args(["-D", "-e", "-f"]).arg(&config), 0)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            return Err(format!("{} did not listen within 10 s", sshd.display()).into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let command = format!(
        "ssh -F /dev/null -i {} -p {port} -o IdentitiesOnly=yes -o UserKnownHostsFile={} -o StrictHostKeyChecking=accept-new -o LogLevel=ERROR",
        dir.join("user_key").display(),
        dir.join("known_hosts").display()
    );
    Ok((format!("{user}@127.0.0.1"), command))
}

/// The `ssh` children of `parent`.
fn ssh_children(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).ok().is_some_and(|stat| {
                let Some((head, rest)) = stat.rsplit_once(')') else { return false };
                head.ends_with("(ssh") && rest.split_whitespace().nth(1) == Some(&parent.to_string())
            })
        })
        .collect()
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args = parse_args()?;
    let dir = TempDir::new("tela-paths")?;
    let tela = Tela { bin: args.tela.clone(), dir: dir.path().to_path_buf(), secret: SECRET.into() };
    let mut procs = Procs::default();

    let engine = tela.engine_sim(
        &mut procs,
        &["--model", MODEL, "--ttft-ms", "0", "--prefill-us-per-token", "0", "--tokens-per-s", "1000000"],
    )?;
    let gw = tela.gateway(&mut procs, "gw", &["--no-auth", "--no-ledger"])?;
    let (gateway, anchor) = (gw.api, gw.anchor);
    let (destination, ssh_command) = start_sshd(&mut procs, &args.sshd, dir.path())?;
    let (_, lines) = procs.spawn(
        Command::new(&tela.bin).args(["relay", "--listen", "127.0.0.1:0", "--allow", &anchor]).env("RUST_LOG", "warn"),
        1,
    )?;
    let relay = lines[0].strip_prefix("relay on ").ok_or("unexpected relay output")?.to_string();

    let paths: Vec<(&str, Vec<String>)> = vec![
        ("direct (tcp)", vec!["--transport".into(), "tcp".into()]),
        ("via ssh", vec!["--via-ssh".into(), destination, "--ssh-command".into(), ssh_command]),
        ("via relay", vec!["--relay".into(), relay]),
    ];
    println!("tela-paths: one node, one engine (no TTFT), {} sequential requests per row, loopback", args.requests);
    println!(
        "{:<14} {:>8} {:>9} {:>9} {:>8} {:>8} {:>6}",
        "path", "stream", "p50 ms", "p99 ms", "x p50", "x p99", "errors"
    );
    let mut base: Vec<(f64, f64)> = Vec::new();
    let mut reconnects = Vec::new();
    for (i, (name, flags)) in paths.iter().enumerate() {
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let node = tela.node(&mut procs, &format!("node{i}"), &[&anchor], &format!("http://{engine}"), &flags)?;
        serving(gateway, 1, Duration::from_secs(30)).await?;
        for (j, stream) in [false, true].into_iter().enumerate() {
            let (lat, errors) = measure(gateway, stream, args.requests).await?;
            let (p50, p99) = (pct(&lat, 0.50), pct(&lat, 0.99));
            if i == 0 {
                base.push((p50, p99));
            }
            let (b50, b99) = base[j];
            println!(
                "{name:<14} {:>8} {p50:>9.3} {p99:>9.3} {:>8.2} {:>8.2} {errors:>6}",
                if stream { "yes" } else { "no" },
                p50 / b50,
                p99 / b99
            );
        }
        if *name == "via ssh" {
            let mut sender = connect(gateway).await?;
            for _ in 0..args.cuts {
                let ssh = ssh_children(node);
                let Some(&child) = ssh.first() else { return Err("the node has no ssh child".into()) };
                let cut = Instant::now();
                Command::new("kill").args(["-KILL", &child.to_string()]).status()?;
                loop {
                    if request(&mut sender, gateway, false).await {
                        break;
                    }
                    sender = connect(gateway).await?;
                    if cut.elapsed() > Duration::from_secs(60) {
                        return Err("the node did not come back within 60 s of the ssh cut".into());
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                reconnects.push(cut.elapsed());
                // Let the new tunnel settle before the next cut.
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        // Drained, the node leaves the registry at once, and the next path starts from none.
        Command::new(&tela.bin).args(["drain", "--control", &tela.file(&format!("node{i}.sock"))]).status()?;
        serving(gateway, 0, Duration::from_secs(30)).await?;
        procs.stop(node);
    }
    reconnects.sort();
    let ms: Vec<String> = reconnects.iter().map(|d| format!("{:.0}", d.as_secs_f64() * 1000.0)).collect();
    println!(
        "ssh cut -> node answers again: median {:.0} ms, max {:.0} ms over {} cuts ({} ms)",
        pct(&reconnects, 0.5),
        pct(&reconnects, 1.0),
        reconnects.len(),
        ms.join(", ")
    );
    Ok(())
}
