//! Overflow to an outside provider: a `tela gateway` with `[[overflow]]` sections, whose
//! provider is a second Tela (a lone gateway with its own node, which wants its own key), and a
//! provider that is down (it closes every connection without answering). A key with `overflow=yes` asking for a model no node serves gets the
//! provider's answer, plain and streamed (unbuffered), marked `x-tela-node: overflow:<name>`, charged in the
//! ledger (`tela usage --by key,provider`) with the provider's token counts; a key without it
//! gets the usual 404, and does not see the provider's models in `/v1/models`. When the one
//! node's only fair slot is taken, the overflowing key goes to the provider at once while the
//! other key waits for the node. A provider that is down gives a 502 in OpenAI's error shape.
//! `/status` lists the providers and their counts, and the provider's key appears in no log
//! line of the gateway, even at debug level.

use crate::common;

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};
use tela_gateway::auth::key_line;

/// A key that may overflow, and one that may not.
const KEY_A: &str = "overflow-key-a-0123456789";
const KEY_B: &str = "overflow-key-b-0123456789";
/// A model no node of the gateway under test serves; the provider's node does.
const OUTSIDE: &str = "outside-model";
/// The provider that is down takes this one.
const DOWN_MODEL: &str = "down-model";
/// The down provider's key, from a file.
const DOWN_KEY: &str = "down-provider-secret-987654321";

/// The gateway under test: a `tela gateway` child with its log at debug level.
struct Main {
    _child: ChildGuard,
    base: String,
    anchor: String,
    _stdout: std::io::BufReader<std::process::ChildStdout>,
}

fn start_main(dir: &std::path::Path, provider_base: &str, down_port: u16) -> Main {
    std::fs::write(
        dir.join("main-keys"),
        format!(
            "{} name=lab-a account=proj-a overflow=yes\n{} name=lab-b account=proj-b\n",
            key_line(KEY_A),
            key_line(KEY_B)
        ),
    )
    .expect("key file");
    std::fs::write(dir.join("down.key"), format!("{DOWN_KEY}\n")).expect("down key");
    let config = format!(
        "listen = \"127.0.0.1:0\"\nanchor_listen = \"127.0.0.1:0\"\nidentity = \"{dir}/main.key\"\n\
         api_keys = \"{dir}/main-keys\"\nledger = \"{dir}/main.db\"\nfair_slots_per_node = 1\n\n\
         [[overflow]]\nname = \"second-tela\"\nbase_url = \"{provider_base}/v1\"\napi_key_env = \"TELA_TEST_PROVIDER_KEY\"\n\
         models = [\"{OUTSIDE}\", \"{MODEL}\"]\n\n\
         [[overflow]]\nname = \"down\"\nbase_url = \"http://127.0.0.1:{down_port}/v1\"\napi_key_file = \"{dir}/down.key\"\n\
         models = [\"{DOWN_MODEL}\"]\ntimeout = \"5s\"\n",
        dir = dir.display()
    );
    std::fs::write(dir.join("gateway.toml"), config).expect("config");
    let mut child = Command::new(tela())
        .args(["gateway", "--config", dir.join("gateway.toml").to_str().expect("utf-8")])
        .env("TELA_JOIN_SECRET", SECRET)
        .env("TELA_TEST_PROVIDER_KEY", KEY)
        .env("RUST_LOG", "debug")
        .env_remove("TELA_JOIN")
        .env_remove("TELA_LEDGER")
        .env_remove("TELA_ROUTING")
        .env_remove("TELA_API_KEYS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("main.log")).expect("log"))
        .spawn()
        .expect("start tela gateway");
    let mut stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let child = ChildGuard(child);
    let (mut first, mut second) = (String::new(), String::new());
    stdout.read_line(&mut first).expect("line");
    stdout.read_line(&mut second).expect("line");
    let log = || std::fs::read_to_string(dir.join("main.log")).unwrap_or_default();
    let base = first.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("{first}: {}", log())).to_string();
    let anchor = second.trim().trim_start_matches("anchor on ").to_string();
    Main { _child: child, base, anchor, _stdout: stdout }
}

/// Waits until `base` (asked with `key`) has `n` routable nodes with a tunnel.
async fn wait_nodes(base: &str, key: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let reply = call(base, "GET", "/status", Some(key), None).await;
        let ready = reply.json()["nodes"]
            .as_array()
            .map_or(0, |ns| ns.iter().filter(|n| n["routable"] == true && n["tunnel"] == true).count());
        if ready >= n {
            return;
        }
        assert!(Instant::now() < deadline, "{base}: {ready} of {n} nodes after 30 s: {}", reply.text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The provider's engine: 20 tokens a second, so an answer of [`chat_as`]'s 8 tokens takes 400 ms.
fn paced_provider() -> tela_gateway::engine_sim::EngineSimConfig {
    tela_gateway::engine_sim::EngineSimConfig { tokens_per_s: 20.0, ..engine(&[OUTSIDE, MODEL]) }
}

fn chat_as(model: &str, stream: bool) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "Where does this go?"}], "stream": stream, "max_tokens": 8})
}

fn model_ids(reply: &Reply) -> Vec<String> {
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply.json()["data"].as_array().expect("data").iter().filter_map(|m| m["id"].as_str().map(str::to_string)).collect()
}

#[tokio::test]
async fn keys_allowed_to_overflow_are_served_by_the_outside_provider() {
    within(150, async {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path();
        // The provider: a second Tela that wants its own key (KEY), with a node serving both models.
        let provider_dir = path.join("provider");
        std::fs::create_dir_all(&provider_dir).expect("dir");
        std::fs::write(provider_dir.join("keys"), format!("{} provider\n", key_line(KEY))).expect("keys");
        let provider = start_lone_gateway(&provider_dir, &provider_dir.join("keys"));
        let provider_engine = tela_gateway::engine_sim::spawn(paced_provider(), "127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("engine");
        let _provider_node = spawn_node(
            &provider_dir,
            "provider-node",
            std::slice::from_ref(&provider.anchor),
            provider_engine.local_addr(),
            &[],
        );
        wait_nodes(&provider.base, KEY, 1).await;

        // The gateway under test, with one slow node serving MODEL (an answer of at least 8
        // tokens takes it 2 s).
        // The provider that is down: it takes connections and closes them without a word.
        let down = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let down_port = down.local_addr().expect("addr").port();
        let _down = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
            while let Ok((connection, _)) = down.accept().await {
                drop(connection);
            }
        }));
        let main = start_main(path, &provider.base, down_port);
        let node_engine =
            tela_gateway::engine_sim::spawn(paced(4.0), "127.0.0.1:0".parse().expect("addr")).await.expect("engine");
        let _node = spawn_node(path, "node-0", std::slice::from_ref(&main.anchor), node_engine.local_addr(), &[]);
        wait_nodes(&main.base, KEY_A, 1).await;
        let base = main.base.as_str();

        // A model no node serves: the key that may overflow gets the provider's answer.
        let plain = call(base, "POST", "/v1/chat/completions", Some(KEY_A), Some(chat_as(OUTSIDE, false))).await;
        assert_eq!(plain.status, 200, "{}", plain.text());
        assert_eq!(plain.header("x-tela-node").as_deref(), Some("overflow:second-tela"));
        let answer = plain.json();
        assert_eq!(answer["model"], OUTSIDE);
        assert!(answer["usage"]["completion_tokens"].as_u64().is_some_and(|n| n > 0), "{answer}");
        let prompt_tokens = answer["usage"]["prompt_tokens"].as_u64().expect("prompt tokens");

        let started = Instant::now();
        let response =
            send(base, "POST", "/v1/chat/completions", Some(KEY_A), Some(chat_as(OUTSIDE, true).to_string())).await;
        let streamed = read_stream(response, started).await;
        assert_eq!((streamed.status, streamed.cut), (200, false), "{}", streamed.text());
        assert_eq!(streamed.node(), "overflow:second-tela");
        assert_eq!(streamed.events().last().map(String::as_str), Some("[DONE]"), "{}", streamed.text());
        assert!(streamed.events().len() > 2, "{}", streamed.text());
        // Unbuffered: its 8 tokens take the provider 400 ms, and the first arrives long before the last.
        let (first, last) = (streamed.chunks[0].0, streamed.chunks[streamed.chunks.len() - 1].0);
        assert!(last.saturating_sub(first) >= Duration::from_millis(200), "chunks at {first:?} and {last:?}");
        // The gateway asked the provider for the usage and took it back out: the client did not ask.
        assert!(!streamed.text().contains("usage"), "{}", streamed.text());

        // The key that may not overflow: the usual 404, and no trace of the provider's models.
        let refused = call(base, "POST", "/v1/chat/completions", Some(KEY_B), Some(chat_as(OUTSIDE, false))).await;
        assert_eq!(refused.status, 404, "{}", refused.text());
        assert_eq!(refused.json()["error"]["code"], "model_not_found", "{}", refused.text());
        assert!(refused.header("x-tela-node").is_none());
        let seen_a = model_ids(&call(base, "GET", "/v1/models", Some(KEY_A), None).await);
        let seen_b = model_ids(&call(base, "GET", "/v1/models", Some(KEY_B), None).await);
        assert!(seen_a.contains(&OUTSIDE.to_string()) && seen_a.contains(&MODEL.to_string()), "{seen_a:?}");
        assert_eq!(seen_b, [MODEL], "a key that may not overflow sees only the federation's models");

        // Saturation: a long stream holds the node's only slot.
        let hold_started = Instant::now();
        let mut long = chat_as(MODEL, true);
        long["max_tokens"] = json!(120);
        let holding = send(base, "POST", "/v1/chat/completions", Some(KEY_B), Some(long.to_string())).await;
        let holder = holding.headers().get("x-tela-node").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        assert!(!holder.is_empty() && !holder.starts_with("overflow:"), "the node serves the first: {holder}");
        let holding = tokio::spawn(read_stream(holding, hold_started));
        let overflowed = call(base, "POST", "/v1/chat/completions", Some(KEY_A), Some(chat_as(MODEL, false))).await;
        assert_eq!(overflowed.status, 200, "{}", overflowed.text());
        assert_eq!(overflowed.header("x-tela-node").as_deref(), Some("overflow:second-tela"), "saturated: overflow");
        assert!(!holding.is_finished(), "the overflow did not wait for the node's stream");
        let waited = call(base, "POST", "/v1/chat/completions", Some(KEY_B), Some(chat_as(MODEL, false))).await;
        assert_eq!(waited.status, 200, "{}", waited.text());
        assert_eq!(waited.header("x-tela-node").as_deref(), Some(holder.as_str()), "the other key waits for the node");
        assert_eq!(holding.await.expect("stream").status, 200);

        // A provider that is down: a clear 502 in OpenAI's shape.
        let down = call(base, "POST", "/v1/chat/completions", Some(KEY_A), Some(chat_as(DOWN_MODEL, false))).await;
        assert_eq!(down.status, 502, "{}", down.text());
        let error = &down.json()["error"];
        assert_eq!(error["code"], "overflow_provider_unavailable", "{}", down.text());
        let message = error["message"].as_str().unwrap_or_default();
        assert!(message.contains("'down'") && message.contains("no answer"), "{message}");

        // /status: the providers and their counts, never their keys.
        let status = call(base, "GET", "/status", Some(KEY_A), None).await;
        let overflow = status.json()["overflow"].clone();
        assert_eq!(overflow[0]["name"], "second-tela", "{overflow}");
        assert_eq!(
            (overflow[0]["requests"].as_u64(), overflow[0]["failed"].as_u64()),
            (Some(3), Some(0)),
            "{overflow}"
        );
        assert_eq!(
            (overflow[1]["requests"].as_u64(), overflow[1]["failed"].as_u64()),
            (Some(1), Some(1)),
            "{overflow}"
        );
        assert!(!status.text().contains(KEY) && !status.text().contains(DOWN_KEY));

        // The ledger: the overflowed requests are lab-a's, marked with the provider.
        let ledger = path.join("main.db");
        let mut rows = Value::Null;
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let out = Command::new(tela())
                .args([
                    "usage",
                    "--ledger",
                    ledger.to_str().expect("utf-8"),
                    "--by",
                    "key,provider",
                    "--format",
                    "json",
                ])
                .output()
                .expect("run tela usage");
            assert!(out.status.success(), "tela usage: {}", String::from_utf8_lossy(&out.stderr));
            rows = serde_json::from_slice::<Value>(&out.stdout).expect("json")["rows"].clone();
            let total: u64 = rows.as_array().map_or(0, |r| r.iter().filter_map(|r| r["requests"].as_u64()).sum());
            if total >= 7 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let row = |key: &str, provider: &str| {
            rows.as_array()
                .and_then(|r| r.iter().find(|r| r["key"] == key && r["provider"] == provider))
                .cloned()
                .unwrap_or_else(|| panic!("no row for {key}/{provider}: {rows:#}"))
        };
        let outside = row("lab-a", "second-tela");
        assert_eq!(outside["requests"], 3, "{rows:#}");
        assert!(outside["prompt_tokens"].as_u64().is_some_and(|n| n >= 3 * prompt_tokens), "{rows:#}");
        assert!(outside["completion_tokens"].as_u64().is_some_and(|n| n > 0), "{rows:#}");
        let failed = row("lab-a", "down");
        assert_eq!((failed["requests"].as_u64(), failed["errors"].as_u64()), (Some(1), Some(1)), "{rows:#}");
        let federation = row("lab-b", "-");
        assert_eq!(federation["requests"], 3, "the 404 and the node's two answers: {rows:#}");

        // The provider's keys are in no log line, though the overflows are.
        let log = std::fs::read_to_string(path.join("main.log")).expect("log");
        assert!(log.contains("overflows to the outside provider 'second-tela'"), "{log}");
        assert!(!log.contains(KEY), "the provider's key leaked into the log");
        assert!(!log.contains(DOWN_KEY), "the down provider's key leaked into the log");
    })
    .await;
}
