//! `tela-load`: the gateway's overhead, side by side with vllm-router, on loopback.
//!
//! One run starts two built-in engine simulators (`tela engine-sim`, no time to first token,
//! a million tokens per second, so that what is measured is the path and not the engine) and
//! sends the same chat requests three ways:
//!
//! - **direct** — to the engines themselves (round-robin by the client): the baseline;
//! - **tela** — through `tela gateway` → tunnel → `tela node` → engine (two nodes, QUIC);
//! - **vllm-router** — through vllm-router (`--policy power_of_two`) in front of the same engines,
//!   when its `vllm-router` command is found (`benches/setup-vllm-router.sh` installs 0.1.17).
//!
//! For each: concurrency 1 and 32, streamed and not, each worker on one keep-alive HTTP/1.1
//! connection with `TCP_NODELAY` (a per-stream stall on keep-alive connections shows up as
//! ~40 ms at p50). Latency is request sent to last body byte; "added" is the path's percentile
//! minus the direct one. The gateway's resident memory is read from `/proc` when idle and
//! after the load. `--counters` adds, for each Tela phase, the CPU time and context switches
//! per request of the gateway and of the nodes (from `/proc`): unlike latency, they hardly move
//! with other load on the machine, so they compare two builds on a busy one. Every phase is
//! bounded in requests and in time, and every process started is killed on exit.
//!
//! ```text
//! cargo build --release -p tela-gateway -p tela-benches
//! benches/setup-vllm-router.sh            # optional: vllm-router 0.1.17 into .ci/cache/bench-venv
//! target/release/tela-load [--requests N] [--seconds S] [--tela PATH] [--vllm-router PATH]
//!                           [--node-transport auto|quic|tcp] [--concurrency 1,32] [--counters]
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use tela_benches::client::{chat_ok, connect, percentile_ms as pct, serving_nodes, short_chat, wait_until, Result};
use tela_benches::process::{find_vllm_router, free_port, require_tela, Procs, Tela, TempDir};

const MODEL: &str = "bench";
const KEY: &str = "tela-load-benchmark-key";
const SECRET: &str = "tela-load benchmark secret";
/// A request not answered within this counts as an error (and its connection is replaced).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

struct Args {
    tela: PathBuf,
    vllm_router: Option<PathBuf>,
    requests: usize,
    seconds: f64,
    node_transport: String,
    concurrency: Vec<usize>,
    counters: bool,
    /// More arguments for `tela gateway` (`--gateway-arg --no-ledger`, ...).
    gateway_args: Vec<String>,
}

fn parse_args() -> Result<Args> {
    let exe = std::env::current_exe()?;
    let mut args = Args {
        tela: exe.with_file_name("tela"),
        vllm_router: find_vllm_router(),
        requests: 20_000,
        seconds: 10.0,
        node_transport: "auto".into(),
        concurrency: vec![1, 32],
        counters: false,
        gateway_args: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--tela" => args.tela = PathBuf::from(value()?),
            "--vllm-router" => args.vllm_router = Some(PathBuf::from(value()?)),
            "--no-vllm-router" => args.vllm_router = Some(PathBuf::new()),
            "--requests" => args.requests = value()?.parse()?,
            "--seconds" => args.seconds = value()?.parse()?,
            "--node-transport" => args.node_transport = value()?,
            "--counters" => args.counters = true,
            "--gateway-arg" => args.gateway_args.push(value()?),
            "--concurrency" => {
                args.concurrency = value()?.split(',').map(str::parse).collect::<std::result::Result<_, _>>()?
            }
            "-h" | "--help" => {
                println!(
                    "tela-load [--requests N] [--seconds S] [--tela PATH] [--vllm-router PATH | --no-vllm-router] \
                     [--node-transport auto|quic|tcp] [--concurrency 1,32] [--counters] [--gateway-arg ARG]..."
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other} (see --help)").into()),
        }
    }
    require_tela(&args.tela)?;
    Ok(args)
}

fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kib| kib / 1024.0)
}

struct Outcome {
    latencies: Vec<Duration>,
    errors: usize,
    wall: Duration,
}

/// `concurrency` workers, each on its own keep-alive connection to one of `targets` (in turn),
/// until `requests` are done or `seconds` have passed.
async fn load(
    targets: &[SocketAddr],
    concurrency: usize,
    stream: bool,
    requests: usize,
    seconds: f64,
    key: Option<&str>,
) -> Result<Outcome> {
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let per_worker = requests.div_ceil(concurrency);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..concurrency {
        let addr = targets[w % targets.len()];
        let key = key.map(str::to_string);
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(per_worker);
            let mut errors = 0;
            let Ok(mut sender) = connect(addr).await else { return (lat, per_worker) };
            let payload = short_chat(MODEL, stream);
            for _ in 0..per_worker {
                if Instant::now() > deadline {
                    break;
                }
                let t0 = Instant::now();
                let ok = chat_ok(&mut sender, addr, key.as_deref(), payload.clone(), REQUEST_TIMEOUT).await;
                match ok {
                    true => lat.push(t0.elapsed()),
                    false => {
                        errors += 1;
                        match connect(addr).await {
                            Ok(s) => sender = s,
                            Err(_) => break,
                        }
                    }
                }
            }
            (lat, errors)
        }));
    }
    let mut latencies = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (l, e) = t.await?;
        latencies.extend(l);
        errors += e;
    }
    latencies.sort();
    Ok(Outcome { latencies, errors, wall: started.elapsed() })
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args = parse_args()?;
    let dir = TempDir::new("tela-load")?;
    let tela = Tela { bin: args.tela.clone(), dir: dir.path().to_path_buf(), secret: SECRET.into() };
    let mut procs = Procs::default();

    // Two engines.
    let mut engines = Vec::new();
    for _ in 0..2 {
        engines.push(tela.engine_sim(
            &mut procs,
            &["--model", MODEL, "--ttft-ms", "0", "--prefill-us-per-token", "0", "--tokens-per-s", "1000000"],
        )?);
    }

    // Tela: gateway + two nodes.
    std::fs::write(dir.path().join("keys"), tela.hash_key(KEY, None)?)?;
    let keys = tela.file("keys");
    let gateway_args: Vec<&str> =
        ["--api-keys", keys.as_str()].into_iter().chain(args.gateway_args.iter().map(String::as_str)).collect();
    let gw = tela.gateway(&mut procs, "gw", &gateway_args)?;
    let (gateway, gw_pid) = (gw.api, gw.pid);
    let mut node_pids = Vec::new();
    for (i, e) in engines.iter().enumerate() {
        let transport = ["--transport", args.node_transport.as_str()];
        node_pids.push(tela.node(
            &mut procs,
            &format!("node{i}"),
            &[&gw.anchor],
            &format!("http://{e}"),
            &transport,
        )?);
    }
    serving_nodes(gateway, 2, Duration::from_secs(30)).await?;
    let gateway_idle = rss_mib(gw_pid);

    // vllm-router in front of the same engines.
    let router = match &args.vllm_router {
        Some(bin) if bin.as_os_str().is_empty() => None,
        Some(bin) => {
            let port = free_port()?;
            let mut cmd = Command::new(bin);
            cmd.args([
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--policy",
                "power_of_two",
                "--log-level",
                "warning",
            ])
            .args(["--prometheus-port", &free_port()?.to_string()])
            .arg("--worker-urls")
            .args(engines.iter().map(|e| format!("http://{e}")));
            let (pid, _) = procs.spawn(&mut cmd, 0)?;
            let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
            match wait_until(addr, "/v1/models", None, Duration::from_secs(60), |_| true).await {
                Ok(()) => Some((addr, pid)),
                Err(e) => {
                    eprintln!("vllm-router did not come up ({e}); its rows are left out");
                    None
                }
            }
        }
        None => {
            eprintln!("vllm-router not found (benches/setup-vllm-router.sh installs 0.1.17); its rows are left out");
            None
        }
    };
    let router_idle = router.map(|(_, pid)| rss_mib(pid));

    println!(
        "{:<12} {:<6} {:>4} {:>6} {:>6} {:>9} {:>8} {:>8} {:>10} {:>10}",
        "path", "mode", "conc", "reqs", "errors", "req/s", "p50 ms", "p99 ms", "+p50 ms", "+p99 ms"
    );
    for &concurrency in &args.concurrency {
        for stream in [false, true] {
            let mode = if stream { "stream" } else { "json" };
            let requests = if concurrency == 1 { args.requests / 10 } else { args.requests };
            let mut paths: Vec<(&str, Vec<SocketAddr>, Option<&str>)> =
                vec![("direct", engines.clone(), None), ("tela", vec![gateway], Some(KEY))];
            if let Some((addr, _)) = router {
                paths.push(("vllm-router", vec![addr], None));
            }
            let mut base = (f64::NAN, f64::NAN);
            for (name, targets, key) in paths {
                // Warm up connections, pools and caches first.
                load(&targets, concurrency, stream, concurrency * 20, 5.0, key).await?;
                let before = (sched(&[gw_pid]), sched(&node_pids));
                let o = load(&targets, concurrency, stream, requests, args.seconds, key).await?;
                if name == "tela" && args.counters {
                    let n = o.latencies.len().max(1) as f64;
                    let (g, nd) = (sched(&[gw_pid]).since(before.0), sched(&node_pids).since(before.1));
                    eprintln!(
                        "  per request: gateway {:.1} us cpu {:.2} switches; nodes {:.1} us cpu {:.2} switches",
                        g.cpu_ns as f64 / n / 1e3,
                        g.switches as f64 / n,
                        nd.cpu_ns as f64 / n / 1e3,
                        nd.switches as f64 / n
                    );
                }
                let (p50, p99) = (pct(&o.latencies, 0.50), pct(&o.latencies, 0.99));
                if name == "direct" {
                    base = (p50, p99);
                }
                let rps = o.latencies.len() as f64 / o.wall.as_secs_f64();
                let added = |v: f64, b: f64| if name == "direct" { "-".to_string() } else { format!("{:.3}", v - b) };
                println!(
                    "{:<12} {:<6} {:>4} {:>6} {:>6} {:>9.0} {:>8.3} {:>8.3} {:>10} {:>10}",
                    name,
                    mode,
                    concurrency,
                    o.latencies.len(),
                    o.errors,
                    rps,
                    p50,
                    p99,
                    added(p50, base.0),
                    added(p99, base.1)
                );
            }
        }
    }
    println!();
    println!("tela gateway RSS: {gateway_idle:.1} MiB idle, {:.1} MiB after the load", rss_mib(gw_pid));
    if let (Some((_, pid)), Some(idle)) = (router, router_idle) {
        println!("vllm-router RSS:  {idle:.1} MiB idle, {:.1} MiB after the load", rss_mib(pid));
    }
    Ok(())
}

/// CPU time and context switches of a set of processes, all threads summed.
#[derive(Clone, Copy, Default)]
struct Sched {
    cpu_ns: u64,
    switches: u64,
}

impl Sched {
    fn since(self, before: Sched) -> Sched {
        Sched {
            cpu_ns: self.cpu_ns.saturating_sub(before.cpu_ns),
            switches: self.switches.saturating_sub(before.switches),
        }
    }
}

/// Reads [`Sched`] from `/proc` (zero for processes that are gone).
fn sched(pids: &[u32]) -> Sched {
    let mut total = Sched::default();
    for pid in pids {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { continue };
        for t in tasks.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("schedstat")) {
                total.cpu_ns += s.split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(0);
            }
            if let Ok(s) = std::fs::read_to_string(t.path().join("status")) {
                for l in s.lines() {
                    if let Some(v) = l
                        .strip_prefix("voluntary_ctxt_switches:")
                        .or_else(|| l.strip_prefix("nonvoluntary_ctxt_switches:"))
                    {
                        total.switches += v.trim().parse::<u64>().unwrap_or(0);
                    }
                }
            }
        }
    }
    total
}
