//! Named keys with limits: OpenAI's `x-ratelimit-*` headers on every response to a limited
//! key, 429 with `Retry-After` in OpenAI's error shape over a limit, a model the key may not
//! use answered exactly like a model nobody serves, other keys unaffected, and a malformed
//! edit of the key file refused while the keys in force (and their counters) stay.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;
use tela_gateway::auth::key_line;
use tela_gateway::engine_sim::EngineSimConfig;
use tela_gateway::gateway::Gateway;
use tela_gateway::limits::estimate_tokens;

/// A key limited to [`MODEL`], 3 requests and 10,000 tokens a minute.
const LIMITED: &str = "limited-key-0123456789";

/// A model the node serves that [`LIMITED`] may not use.
const OTHER: &str = "other-model";

/// Starts a gateway whose key file is `keys`, with one node serving `engine`.
async fn federation(keys: &str, engine: EngineSimConfig) -> Fed {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("api-keys"), keys).expect("write the key file");
    let gateway = Gateway::start(gateway_config(dir.path())).await.expect("gateway starts");
    let mut fed = Fed { gateway, nodes: Vec::new(), engines: Vec::new(), dir };
    fed.add_node(engine, &[]).await;
    fed.wait_routable(1).await;
    fed
}

/// An OpenAI reset header (`"20s"`, `"6m0s"`, `"1.5s"`, `"48ms"`) as a duration.
fn parse_reset(text: &str) -> Duration {
    let mut total = 0.0;
    let mut number = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() || c == '.' {
            number.push(c);
            continue;
        }
        let value: f64 = number.parse().unwrap_or_else(|_| panic!("bad reset '{text}'"));
        number.clear();
        total += match c {
            'h' => value * 3600.0,
            'm' if chars.peek() == Some(&'s') => {
                chars.next();
                value / 1000.0
            }
            'm' => value * 60.0,
            's' => value,
            _ => panic!("bad reset '{text}'"),
        };
    }
    assert!(number.is_empty(), "bad reset '{text}'");
    Duration::from_secs_f64(total)
}

fn assert_openai_error(reply: &Reply, status: u16, kind: &str, code: &str) -> Value {
    assert_eq!(reply.status, status, "{}", reply.text());
    let v = reply.json();
    assert_eq!(v["error"]["type"], kind, "{v}");
    assert_eq!(v["error"]["code"], code, "{v}");
    assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert_eq!(reply.header("content-type").as_deref(), Some("application/json"));
    v
}

fn retry_after(reply: &Reply) -> u64 {
    let value = reply.header("retry-after").unwrap_or_else(|| panic!("no Retry-After: {}", reply.text()));
    value.parse().unwrap_or_else(|_| panic!("Retry-After '{value}' is not whole seconds"))
}

fn model_ids(reply: &Reply) -> Vec<String> {
    assert_eq!(reply.status, 200, "{}", reply.text());
    let v = reply.json();
    v["data"].as_array().expect("a list").iter().filter_map(|m| m["id"].as_str().map(str::to_string)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limited_keys_get_rate_headers_429s_and_only_their_models() {
    within(90, async {
        let limited_line = format!(
            "{} name=lab-a owner=\"Ada Lovelace\" account=proj-42 models={MODEL} rpm=3 tpm=10000",
            key_line(LIMITED)
        );
        let keys = format!("# tenants\n{} test\n{limited_line}\n", key_line(KEY));
        let fed = federation(&keys, engine(&[MODEL, OTHER])).await;
        let base = fed.base();
        let body = chat(MODEL, false, 4);
        let estimate = estimate_tokens("/v1/chat/completions", body.to_string().as_bytes());

        // Three requests a minute: each one's headers count down; the reset is the time until
        // the bucket is full again, 20 s per request used.
        let first = post_as(&base, LIMITED, body.clone()).await;
        let minute_started = Instant::now();
        assert_eq!(first.status, 200, "{}", first.text());
        assert_eq!(first.header("x-ratelimit-limit-requests").as_deref(), Some("3"));
        assert_eq!(first.header("x-ratelimit-remaining-requests").as_deref(), Some("2"));
        assert_eq!(first.header("x-ratelimit-reset-requests").as_deref(), Some("20s"));
        assert_eq!(first.header("x-ratelimit-limit-tokens").as_deref(), Some("10000"));
        let remaining_tokens = (10_000 - estimate).to_string();
        assert_eq!(first.header("x-ratelimit-remaining-tokens").as_deref(), Some(remaining_tokens.as_str()));
        let reset_tokens = parse_reset(&first.header("x-ratelimit-reset-tokens").expect("reset-tokens"));
        let full_refill = Duration::from_secs_f64(estimate as f64 * 60.0 / 10_000.0);
        assert!(
            reset_tokens >= full_refill && reset_tokens <= full_refill + Duration::from_millis(1),
            "{reset_tokens:?}"
        );
        let second = post_as(&base, LIMITED, body.clone()).await;
        assert_eq!(second.header("x-ratelimit-remaining-requests").as_deref(), Some("1"));
        let third = post_as(&base, LIMITED, body.clone()).await;
        assert_eq!(third.status, 200);
        assert_eq!(third.header("x-ratelimit-remaining-requests").as_deref(), Some("0"));
        let reset = parse_reset(&third.header("x-ratelimit-reset-requests").expect("reset"));
        assert!(reset > Duration::from_secs(50) && reset <= Duration::from_secs(60), "{reset:?}");

        // The fourth within the minute: 429 in OpenAI's shape, with Retry-After.
        let fourth = post_as(&base, LIMITED, body.clone()).await;
        let v = assert_openai_error(&fourth, 429, "requests", "rate_limit_exceeded");
        let message = v["error"]["message"].as_str().expect("message");
        assert!(message.contains("lab-a") && message.contains("Limit 3"), "{message}");
        let wait = retry_after(&fourth);
        assert!((1..=20).contains(&wait), "Retry-After {wait}");
        assert_eq!(fourth.header("x-ratelimit-remaining-requests").as_deref(), Some("0"));

        // Another key is unaffected, and a key without limits gets no rate headers.
        let other = post_as(&base, KEY, body.clone()).await;
        assert_eq!(other.status, 200, "{}", other.text());
        assert!(other.headers.keys().all(|h| !h.as_str().starts_with("x-ratelimit")), "{:?}", other.headers);

        // A model the key may not use: exactly the 404 of a model nobody serves, which names
        // only the key's models (checked before the limits, so not a 429).
        let hidden = post_as(&base, LIMITED, chat(OTHER, false, 4)).await;
        let unknown = post_as(&base, LIMITED, chat("gpt-unknown", false, 4)).await;
        let hidden_v = assert_openai_error(&hidden, 404, "invalid_request_error", "model_not_found");
        let unknown_v = assert_openai_error(&unknown, 404, "invalid_request_error", "model_not_found");
        let normalise = |v: &Value, model: &str| v.to_string().replace(model, "MODEL");
        assert_eq!(normalise(&hidden_v, OTHER), normalise(&unknown_v, "gpt-unknown"));
        assert!(!unknown.text().contains(OTHER), "{}", unknown.text());
        assert!(
            post_as(&base, KEY, chat("gpt-unknown", false, 4)).await.text().contains(OTHER),
            "an unlimited key sees all"
        );
        assert_eq!(model_ids(&call(&base, "GET", "/v1/models", Some(LIMITED), None).await), vec![MODEL.to_string()]);
        assert_eq!(model_ids(&call(&base, "GET", "/v1/models", Some(KEY), None).await), vec![OTHER, MODEL]);
        let one = call(&base, "GET", &format!("/v1/models/{OTHER}"), Some(LIMITED), None).await;
        assert_openai_error(&one, 404, "invalid_request_error", "model_not_found");
        assert_eq!(call(&base, "GET", &format!("/v1/models/{MODEL}"), Some(LIMITED), None).await.status, 200);
        let status = call(&base, "GET", "/status", Some(LIMITED), None).await;
        assert_openai_error(&status, 403, "permission_error", "forbidden");
        // The model list is not an inference request: it shows the headers, charging nothing.
        let listed = call(&base, "GET", "/v1/models", Some(LIMITED), None).await;
        assert_eq!(listed.header("x-ratelimit-limit-requests").as_deref(), Some("3"));
        let metrics = call(&base, "GET", "/metrics", Some(KEY), None).await.text();
        assert!(metrics.contains(r#"tela_gateway_key_refusals_total{key="lab-a",limit="requests"} 1"#), "{metrics}");

        // An unknown key is refused as before.
        let stranger = call(&base, "POST", "/v1/chat/completions", Some("not-a-key"), Some(body.clone())).await;
        assert_openai_error(&stranger, 401, "authentication_error", "invalid_api_key");

        // A malformed edit is refused: the keys in force stay, the new one does not come in.
        let keys_path = fed.dir.path().join("api-keys");
        let broken = format!("{keys}{} name=new rpm=ten\n", key_line("new-key"));
        std::fs::write(&keys_path, broken).expect("edit the key file");
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert_eq!(post_as(&base, KEY, body.clone()).await.status, 200, "the old keys still work");
        assert_eq!(post_as(&base, "new-key", body.clone()).await.status, 401, "the broken file was not taken");

        // A good edit comes in, and the limited key keeps its counters: its minute is not reset.
        std::fs::write(&keys_path, format!("{keys}{} name=new\n", key_line("new-key"))).expect("edit the key file");
        let mut accepted = false;
        for _ in 0..100 {
            if post_as(&base, "new-key", body.clone()).await.status == 200 {
                accepted = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(accepted, "the new key was not accepted within 10 s");
        let after = post_as(&base, LIMITED, body.clone()).await;
        assert!(minute_started.elapsed() < Duration::from_secs(40), "the test ran too slowly to tell");
        // Within 40 s of the first request at most one more fits, and it leaves none.
        assert_eq!(after.header("x-ratelimit-remaining-requests").as_deref(), Some("0"), "{}", after.text());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_tokens_and_budgets_are_limited_per_key() {
    within(90, async {
        const ONE_AT_A_TIME: &str = "one-at-a-time-key";
        const FEW_TOKENS: &str = "few-tokens-key";
        const SMALL_BUDGET: &str = "small-budget-key";
        let keys = format!(
            "{} test\n{} name=serial concurrent=1\n{} name=frugal tpm=60\n{} name=thrifty budget_tokens=30/day\n",
            key_line(KEY),
            key_line(ONE_AT_A_TIME),
            key_line(FEW_TOKENS),
            key_line(SMALL_BUDGET)
        );
        // 20 tokens a second: a 20-token stream stays open for about a second.
        let fed = federation(&keys, paced(20.0)).await;
        let base = fed.base();

        // One request at a time: a second one while a stream is open gets 429; other keys do not.
        let started = Instant::now();
        let open =
            send(&base, "POST", "/v1/chat/completions", Some(ONE_AT_A_TIME), Some(chat(MODEL, true, 20).to_string()))
                .await;
        assert_eq!(open.status(), 200);
        let second = post_as(&base, ONE_AT_A_TIME, chat(MODEL, false, 2)).await;
        assert_openai_error(&second, 429, "requests", "rate_limit_exceeded");
        assert_eq!(retry_after(&second), 1);
        assert!(second.headers.keys().all(|h| !h.as_str().starts_with("x-ratelimit")), "no rate limit, no headers");
        assert_eq!(post_as(&base, KEY, chat(MODEL, false, 2)).await.status, 200, "another key is unaffected");
        let done = read_stream(open, started).await;
        assert_eq!(done.events().last().map(String::as_str), Some("[DONE]"));
        // The slot is released when the stream's body ends.
        wait_idle(&fed).await;
        assert_eq!(post_as(&base, ONE_AT_A_TIME, chat(MODEL, false, 2)).await.status, 200);

        // 60 tokens a minute: a request estimated at 44 fits, a second does not yet, and one
        // larger than the whole limit never will (no Retry-After).
        let big = chat(MODEL, false, 40);
        let estimate = estimate_tokens("/v1/chat/completions", big.to_string().as_bytes());
        assert_eq!(estimate, 44, "'user' and 'Hello there' are 15 characters: 4 tokens, and 40 to generate");
        let first = post_as(&base, FEW_TOKENS, big.clone()).await;
        assert_eq!(first.status, 200, "{}", first.text());
        assert_eq!(first.header("x-ratelimit-limit-tokens").as_deref(), Some("60"));
        assert_eq!(first.header("x-ratelimit-remaining-tokens").as_deref(), Some("16"));
        assert_eq!(first.header("x-ratelimit-reset-tokens").as_deref(), Some("44s"));
        assert!(first.header("x-ratelimit-limit-requests").is_none(), "no request limit, no request headers");
        let over = post_as(&base, FEW_TOKENS, big).await;
        assert_openai_error(&over, 429, "tokens", "rate_limit_exceeded");
        let wait = retry_after(&over);
        assert!((20..=28).contains(&wait), "28 tokens short at 1 a second, less what refilled: {wait}");
        let too_large = post_as(&base, FEW_TOKENS, chat(MODEL, false, 100)).await;
        let v = assert_openai_error(&too_large, 429, "tokens", "rate_limit_exceeded");
        assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("max_tokens")), "{v}");
        assert_eq!(too_large.header("retry-after"), None, "retrying cannot help");

        // A budget of 30 tokens a day, spent 8 at a time as responses end: four requests, then
        // 429 insufficient_quota until the next UTC day.
        let small = chat(MODEL, false, 4);
        assert_eq!(estimate_tokens("/v1/chat/completions", small.to_string().as_bytes()), 8);
        let mut served = 0;
        let refused = loop {
            let reply = post_as(&base, SMALL_BUDGET, small.clone()).await;
            if reply.status != 200 {
                break reply;
            }
            served += 1;
            assert!(served <= 4, "the budget did not hold");
            // The spend is counted when the gateway sees the body end, just after the client.
            wait_idle(&fed).await;
        };
        assert_eq!(served, 4);
        assert_openai_error(&refused, 429, "insufficient_quota", "insufficient_quota");
        assert!((1..=86_400).contains(&retry_after(&refused)));
        assert_eq!(post_as(&base, KEY, small).await.status, 200, "another key is unaffected");
    })
    .await;
}

/// The OpenAI Python SDK (`.ci/setup-python.sh`, or `TELA_SDK_PYTHON`) raises `RateLimitError`
/// over a key's limit and `NotFoundError` for a model the key may not use
/// (`gateway/tests/python/sdk_key_limits.py`).
#[cfg_attr(
    not(tela_sdk),
    ignore = "needs the OpenAI Python SDK: run .ci/test, or export what .ci/setup-python.sh prints"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_raises_rate_limit_error_over_a_key_limit() {
    let python = std::env::var_os("TELA_SDK_PYTHON").map_or_else(
        || std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.ci/cache/sdk-venv/bin/python"),
        std::path::PathBuf::from,
    );
    assert!(python.exists(), "no OpenAI SDK environment: run .ci/setup-python.sh and export what it prints");
    within(120, async {
        let keys = format!("{} test\n{} name=sdk models={MODEL} rpm=1\n", key_line(KEY), key_line(LIMITED));
        let fed = federation(&keys, engine(&[MODEL, OTHER])).await;
        let script = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/sdk_key_limits.py");
        let mut cmd = std::process::Command::new(&python);
        cmd.args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
            .arg(&script)
            .env("TELA_BASE_URL", format!("{}/v1", fed.base()))
            .env("TELA_LIMITED_API_KEY", LIMITED)
            .env("TELA_MODEL", MODEL)
            .env("TELA_HIDDEN_MODEL", OTHER)
            .env_remove("OPENAI_API_KEY")
            .env_remove("OPENAI_BASE_URL");
        let out = tokio::task::block_in_place(|| cmd.output()).expect("run pytest");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "the OpenAI SDK did not see the key's limits as expected:\n{text}");
        assert!(text.contains("2 passed"), "{text}");
    })
    .await;
}

/// Waits until the gateway has seen every response body end: the key's guard is released with
/// the node's in-flight count, which `/status` shows.
async fn wait_idle(fed: &Fed) {
    let idle = eventually(Duration::from_secs(10), || {
        fed.gateway.status()["nodes"].as_array().is_some_and(|nodes| nodes.iter().all(|n| n["in_flight"] == 0))
    })
    .await;
    assert!(idle, "responses still in flight: {:#}", fed.gateway.status());
}

/// `POST /v1/chat/completions` with `key`.
async fn post_as(base: &str, key: &str, body: Value) -> Reply {
    call(base, "POST", "/v1/chat/completions", Some(key), Some(body)).await
}
