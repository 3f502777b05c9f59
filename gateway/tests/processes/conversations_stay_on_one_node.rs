//! Prefix affinity, the default routing: every turn of a conversation goes to the node that
//! served its first turn (`x-tela-node` stays the same), different conversations spread over
//! the nodes, and two gateways given the same conversation pick the same node — with no state
//! shared between them: the node is the one the documented rule ranks first for the
//! conversation's head, which the tests compute themselves. A conversation whose first node
//! fails moves, every turn, to its next-ranked node. Requests routing cannot key on (no
//! messages, odd shapes, a huge message) are answered as before.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};
use tela_gateway::engine_sim::FailMode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_turn_of_a_conversation_goes_to_one_node_and_conversations_spread() {
    within(120, async {
        let fed =
            Fed::start(Options { engines: (0..4).map(|_| engine(&[MODEL])).collect(), ..Options::default() }).await;
        let base = fed.base();
        let status = call(&base, "GET", "/status", Some(KEY), None).await.json();
        assert_eq!(status["gateway"]["routing"], "prefix", "prefix affinity is the default: {status:#}");

        let mut conversations: Vec<(Vec<Value>, String)> = (0..12).map(opening).collect();
        let mut nodes: Vec<String> = Vec::new();
        for (messages, first) in conversations.iter_mut() {
            nodes.push(next_turn(&base, messages, first).await);
        }
        // Later turns, interleaved across conversations as concurrent users would send them.
        for round in 1..4 {
            for (i, (messages, _)) in conversations.iter_mut().enumerate() {
                let node = next_turn(&base, messages, &format!("Tell me more, part {round}.")).await;
                assert_eq!(node, nodes[i], "conversation {i} moved at turn {round}");
            }
        }
        // Idle nodes are all within the load bound: each conversation is where the rule ranks
        // it first, which anyone can compute from its head and the node ids.
        for (i, node) in nodes.iter().enumerate() {
            assert_eq!(*node, ranking(&fed, i)[0], "conversation {i} is not on its first-ranked node");
        }
        let used: HashSet<&String> = nodes.iter().collect();
        assert!(used.len() > 1, "12 conversations all went to one node: {nodes:?}");
        for node in &used {
            assert!(fed.node_index(node).is_some(), "x-tela-node {node} names one of the nodes");
        }

        // A streamed turn keeps the node too.
        let (messages, _) = &mut conversations[0];
        let body = turn(messages, "And once more, streamed.");
        let started = Instant::now();
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        let response = send(&base, "POST", "/v1/chat/completions", Some(KEY), Some(streamed.to_string())).await;
        let s = read_stream(response, started).await;
        assert_eq!(s.status, 200, "{}", s.text());
        assert_eq!(s.node(), nodes[0], "the streamed turn moved");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_routing_cannot_key_on_are_answered_as_before() {
    within(60, async {
        let fed =
            Fed::start(Options { engines: (0..3).map(|_| engine(&[MODEL])).collect(), ..Options::default() }).await;
        let base = fed.base();
        let engine = format!("http://{}", fed.engines[0].local_addr());
        // Shapes the gateway does not judge go to a node, which answers as it would directly.
        for body in [
            json!({"model": MODEL, "max_tokens": 4}),
            json!({"model": MODEL, "messages": [], "max_tokens": 4}),
            json!({"model": MODEL, "messages": "hello", "max_tokens": 4}),
            json!({"model": MODEL, "messages": [7, null, {"role": 5, "content": {"x": 1}}], "max_tokens": 4}),
            json!({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}),
        ] {
            let through = post(&base, "/v1/chat/completions", body.clone()).await;
            let direct = call(&engine, "POST", "/v1/chat/completions", None, Some(body.clone())).await;
            assert_eq!(through.status, direct.status, "{body}: {} vs {}", through.text(), direct.text());
            if direct.status != 200 {
                assert_eq!(through.json()["error"]["code"], direct.json()["error"]["code"], "{body}");
            }
        }
        // A model nobody serves: 404 in OpenAI's shape, naming the served ones.
        let unknown = post(&base, "/v1/chat/completions", chat("gpt-unknown", false, 4)).await;
        assert_eq!(unknown.status, 404, "{}", unknown.text());
        assert_eq!(unknown.json()["error"]["code"], "model_not_found");
        assert!(unknown.json()["error"]["message"].as_str().is_some_and(|m| m.contains(MODEL)));

        // A first message far beyond what routing hashes is served, and its conversation keeps
        // its node. (Megabyte bodies are covered by the gateway's unit tests: the simulated
        // engine would spend minutes on their prefill.)
        let huge = "All work and no play makes a dull node. ".repeat(1_000);
        assert!(huge.len() > 2 * tela_core::routing::Prefix::MAX_BLOCKS * tela_core::routing::Prefix::BLOCK_BYTES);
        let mut messages = vec![json!({"role": "system", "content": huge})];
        let first = next_turn(&base, &mut messages, "Summarise the text.").await;
        assert_eq!(next_turn(&base, &mut messages, "Shorter, please.").await, first);
        // A prompt is keyed too: the same long prompt goes to the same node.
        let prompt = "Once upon a time, in a federation of GPUs far away, ".repeat(20);
        let mut seen = HashSet::new();
        for _ in 0..3 {
            let r = post(&base, "/v1/completions", json!({"model": MODEL, "prompt": prompt, "max_tokens": 4})).await;
            assert_eq!(r.status, 200, "{}", r.text());
            seen.insert(r.header("x-tela-node").expect("node"));
        }
        assert_eq!(seen.len(), 1, "one prompt, one node: {seen:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_whose_first_node_fails_stays_on_its_next_ranked_node() {
    within(90, async {
        // Node 0's engine drops every request (the node answers 502); nodes 1 and 2 are healthy.
        let engines = vec![failing(FailMode::Drop), engine(&[MODEL]), engine(&[MODEL])];
        let fed = Fed::start(Options { engines, ..Options::default() }).await;
        let base = fed.base();
        let failing = fed.nodes[0].id.to_string();
        let i = (0..1000).find(|&i| ranking(&fed, i)[0] == failing).expect("some conversation ranks node 0 first");
        let next = ranking(&fed, i)[1].clone();
        let (mut messages, first) = opening(i);
        assert_eq!(next_turn(&base, &mut messages, &first).await, next, "retried on the next-ranked node");
        for round in 1..4 {
            let node = next_turn(&base, &mut messages, &format!("Go on ({round}).")).await;
            assert_eq!(node, next, "turn {round} left the next-ranked node");
        }
        let metrics = call(&base, "GET", "/metrics", Some(KEY), None).await.text();
        let retried = metrics
            .lines()
            .filter(|l| l.starts_with("tela_gateway_retries_total"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
        assert!(retried >= 4.0, "every turn went to the failing node first and was retried:\n{metrics}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_send_a_conversation_to_the_same_node() {
    within(120, async {
        let fed =
            Fed::start(Options { engines: (0..3).map(|_| engine(&[MODEL])).collect(), ..Options::default() }).await;
        let b = spawn_gateway(&fed, "127.0.0.1:0", free_port(), &["--routing", "prefix"]);
        assert!(
            wait_tunnels(&b.base, 3, Duration::from_secs(30)).await,
            "the nodes connected to gateway B; B log:\n{}",
            std::fs::read_to_string(fed.dir.path().join("gateway-b.log")).unwrap_or_default()
        );
        let status = call(&b.base, "GET", "/status", Some(KEY), None).await.json();
        assert_eq!(status["gateway"]["routing"], "prefix", "{status:#}");

        // Each conversation's turns alternate between the gateways, as a client behind a
        // load balancer would send them.
        let mut by_node: HashMap<String, usize> = HashMap::new();
        for i in 0..8 {
            let (mut messages, first) = opening(i);
            let node = next_turn(&fed.base(), &mut messages, &first).await;
            for round in 1..4 {
                let base = if round % 2 == 1 { b.base.clone() } else { fed.base() };
                let again = next_turn(&base, &mut messages, &format!("Go on ({round}).")).await;
                assert_eq!(again, node, "conversation {i}: turn {round} on {base} went elsewhere");
            }
            *by_node.entry(node).or_default() += 1;
        }
        assert!(by_node.len() > 1, "8 conversations all went to one node: {by_node:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_routing_policy_is_refused_with_the_choices() {
    within(30, async {
        let out = Command::new(tela())
            .args(["gateway", "--no-auth", "--listen", "127.0.0.1:0", "--routing", "random"])
            .env_remove("TELA_ROUTING")
            .output()
            .expect("run tela gateway");
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("prefix, least-loaded or p2c"), "{stderr}");
    })
    .await;
}
