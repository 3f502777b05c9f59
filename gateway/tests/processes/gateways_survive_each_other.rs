//! Several gateways: nodes that joined one gateway connect to every gateway they learn of
//! from the registry; killing one leaves the others serving, and the nodes come back to it
//! by themselves when it returns.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// `tela gateway` as a child process (killed on drop).
struct GatewayProc {
    child: Child,
    base: String,
    // Kept open: the gateway prints more lines after the first.
    _stdout: BufReader<std::process::ChildStdout>,
}

impl Drop for GatewayProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_gateway(fed: &Fed, api_port: u16, anchor_port: u16) -> GatewayProc {
    let dir = fed.dir.path();
    let mut child = Command::new(tela())
        .arg("gateway")
        .args(["--listen", &format!("127.0.0.1:{api_port}")])
        .args(["--anchor-listen", &format!("127.0.0.1:{anchor_port}")])
        .args(["--join", &fed.gateway.anchor_addr().to_string()])
        .args(["--identity", dir.join("gateway-b.key").to_str().expect("utf-8")])
        .args(["--api-keys", dir.join("api-keys").to_str().expect("utf-8")])
        .env("TELA_JOIN_SECRET", SECRET)
        .env_remove("TELA_JOIN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("gateway-b.log")).expect("log"))
        .spawn()
        .expect("start tela gateway");
    let stdout = child.stdout.take().expect("stdout");
    let mut stdout = BufReader::new(stdout);
    let mut line = String::new();
    stdout.read_line(&mut line).expect("read the first line");
    let base = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("unexpected: {line}")).to_string();
    GatewayProc { child, base, _stdout: stdout }
}

/// Waits until `base`'s /status shows `n` routable nodes with a tunnel to it.
async fn wait_tunnels(base: &str, n: usize, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let reply = call(base, "GET", "/status", Some(KEY), None).await;
        if reply.status == 200 {
            let connected = reply.json()["nodes"]
                .as_array()
                .map_or(0, |ns| ns.iter().filter(|n| n["routable"] == true && n["tunnel"] == true).count());
            if connected >= n {
                return true;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

async fn serves(base: &str) {
    for _ in 0..5 {
        let r = post(base, "/v1/chat/completions", chat(MODEL, false, 4)).await;
        assert_eq!(r.status, 200, "{base}: {}", r.text());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_one_gateway_leaves_the_other_serving_and_nodes_return_to_it() {
    within(150, async {
        // The nodes are told only about gateway A.
        let fed = Fed::start(Options::default()).await;
        let (api, anchor) = (free_port(), free_port());
        let b = spawn_gateway(&fed, api, anchor);
        assert!(
            wait_tunnels(&b.base, 2, Duration::from_secs(30)).await,
            "the nodes connected to gateway B, learned from the registry; B log:\n{}",
            std::fs::read_to_string(fed.dir.path().join("gateway-b.log")).unwrap_or_default()
        );
        serves(&b.base).await;
        serves(&fed.base()).await;

        // kill -9 gateway B while a stream runs through A.
        let started = Instant::now();
        let open =
            send(&fed.base(), "POST", "/v1/chat/completions", Some(KEY), Some(chat(MODEL, true, 30).to_string())).await;
        drop(b);
        serves(&fed.base()).await;
        let s = read_stream(open, started).await;
        assert_eq!(s.events().last().map(String::as_str), Some("[DONE]"), "{}", s.text());

        // B comes back on the same addresses with the same identity: the nodes redial it.
        let b = spawn_gateway(&fed, api, anchor);
        assert!(
            wait_tunnels(&b.base, 2, Duration::from_secs(60)).await,
            "the nodes reconnected to the returning gateway; B log:\n{}",
            std::fs::read_to_string(fed.dir.path().join("gateway-b.log")).unwrap_or_default()
        );
        serves(&b.base).await;
    })
    .await;
}
