//! The dashboard page, loaded in headless Chromium, fetches `/status` with the key from the
//! address's fragment and renders one row per node.
//!
//! Needs Chromium (`.ci/setup-browser.sh` installs Debian's package; `TELA_CHROMIUM` or
//! `chromium` on PATH). Built without `TELA_CHROMIUM` it shows as ignored; with `CI=true` it always
//! runs, and fails without a browser.

use crate::common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn chromium() -> Option<String> {
    if let Ok(p) = std::env::var("TELA_CHROMIUM") {
        return Some(p);
    }
    ["chromium", "chromium-browser"].iter().find_map(|name| {
        let found = Command::new("sh").args(["-c", &format!("command -v {name}")]).output().ok()?;
        found.status.success().then(|| String::from_utf8_lossy(&found.stdout).trim().to_string())
    })
}

#[cfg_attr(not(tela_chromium), ignore = "needs Chromium: run .ci/test, or export what .ci/setup-browser.sh prints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_a_row_per_node() {
    let browser = chromium().expect("Chromium not found; run .ci/setup-browser.sh and export what it prints");
    within(120, async {
        let fed = Fed::start(Options::default()).await;
        let profile = tempfile::tempdir().expect("profile dir");
        let url = format!("{}/#key={KEY}", fed.base());
        let mut child = Command::new(&browser)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--no-first-run",
                "--virtual-time-budget=5000",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .args(["--dump-dom", &url])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromium");
        // Bounded: Chromium is killed if it has not dumped the page within 60 s.
        let deadline = Instant::now() + Duration::from_secs(60);
        while child.try_wait().expect("wait").is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("chromium did not finish within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let out = child.wait_with_output().expect("output");
        let dom = String::from_utf8_lossy(&out.stdout);
        let rows = dom.matches("class=\"node-row\"").count();
        assert_eq!(rows, 3, "two nodes and the gateway itself are rows:\n{dom}");
        for n in &fed.nodes {
            assert!(dom.contains(&format!("data-node=\"{}\"", tela_runtime::status::hex(&n.id))), "{dom}");
        }
        assert!(dom.contains(">SERVE<"), "{dom}");
        assert!(dom.contains(MODEL), "{dom}");
        assert!(dom.contains("<div id=\"error\"></div>"), "no error shown; the key from the fragment was used:\n{dom}");
    })
    .await;
}
