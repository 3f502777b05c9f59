//! A key's token budget holds across two gateways: after the key spends its budget on
//! gateway A, gateway B refuses it within about one exchange period, and the federation-wide
//! spend stays within the bound `tela_gateway::budgets` states:
//! `budget + (G − 1) × S + F`, with `G = 2` gateways, `S` the most tokens B can admit for the
//! key in one exchange period plus the delivery delay, and `F` the tokens in flight.

use crate::common;

use std::time::Duration;

use common::*;
use tela_gateway::auth::entry_line;
use tela_gateway::gateway::Gateway;

/// The key with a budget.
const BUDGETED: &str = "budgeted-key-0123456789";
/// Another, spent on both gateways at once.
const SHARED: &str = "shared-budget-key-0123456789";
/// Its budget per day, in tokens.
const BUDGET: u64 = 1500;
/// How often both gateways exchange their spend.
const EXCHANGE: Duration = Duration::from_millis(300);
/// Extra time allowed for a spend datagram to arrive and for ticks delayed on a busy machine.
const DELIVERY: Duration = Duration::from_millis(1200);
/// The client sends B at most one request per this, so B admits at most
/// `(EXCHANGE + DELIVERY) / PACE + 1` requests in one exchange period plus the delivery delay.
const PACE: Duration = Duration::from_millis(100);

/// One request of the budgeted key: its status, tokens (if answered) and the reply.
async fn spend(base: &str) -> (Reply, u64) {
    spend_as(base, BUDGETED).await
}

async fn spend_as(base: &str, key: &str) -> (Reply, u64) {
    let reply = call(base, "POST", "/v1/chat/completions", Some(key), Some(chat(MODEL, false, 20))).await;
    let tokens = if reply.status == 200 { reply.json()["usage"]["total_tokens"].as_u64().expect("usage") } else { 0 };
    (reply, tokens)
}

fn assert_out_of_budget(reply: &Reply, gateway: &str) {
    assert_eq!(reply.status, 429, "{gateway}: {}", reply.text());
    let v = reply.json();
    assert_eq!(
        (v["error"]["type"].as_str(), v["error"]["code"].as_str()),
        (Some("insufficient_quota"), Some("insufficient_quota")),
        "{v}"
    );
    let retry: u64 = reply.header("retry-after").and_then(|r| r.parse().ok()).expect("Retry-After in seconds");
    assert!((1..=86_400).contains(&retry), "Retry-After is the time to the end of the UTC day: {retry}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_spent_on_one_gateway_is_refused_on_the_other() {
    within(150, async {
        let dir = tempfile::tempdir().expect("tempdir");
        let keys = format!(
            "{} test\n{}\n{}\n",
            tela_gateway::auth::key_line(KEY),
            entry_line(BUDGETED, &[("name", "lab-a".into()), ("budget_tokens", format!("{BUDGET}/day"))]),
            entry_line(SHARED, &[("name", "lab-b".into()), ("budget_tokens", format!("{BUDGET}/day"))])
        );
        std::fs::write(dir.path().join("api-keys"), keys).expect("key file");
        let mut config = gateway_config(dir.path());
        config.budget_exchange = EXCHANGE;
        let gateway = Gateway::start(config).await.expect("gateway A starts");
        let mut fed = Fed { gateway, nodes: Vec::new(), engines: Vec::new(), dir };
        fed.add_node(engine(&[MODEL]), &[]).await;
        fed.wait_routable(1).await;
        let exchange = format!("{}ms", EXCHANGE.as_millis());
        let b = spawn_gateway(&fed, "127.0.0.1:0", free_port(), &["--budget-exchange", &exchange]);
        assert!(wait_tunnels(&b.base, 1, Duration::from_secs(30)).await, "the node connected to gateway B too");

        // Spend the whole budget on A, one request at a time: A refuses on its own count.
        let (mut on_a, mut biggest) = (0u64, 0u64);
        let mut refused = None;
        for _ in 0..500 {
            let (reply, tokens) = spend(&fed.base()).await;
            if reply.status != 200 {
                refused = Some(reply);
                break;
            }
            on_a += tokens;
            biggest = biggest.max(tokens);
        }
        let refused = refused.expect("A refuses once the budget is spent");
        assert_out_of_budget(&refused, "A");
        assert!(on_a >= BUDGET && on_a < BUDGET + biggest, "A stops at its budget: {on_a} of {BUDGET}");

        // B learns A's spend within one exchange period (plus delivery): at the client's pace
        // it admits a few requests at most, not a budget of its own.
        let most_on_b = ((EXCHANGE + DELIVERY).as_millis() / PACE.as_millis() + 1) as u64;
        let (mut on_b, mut admitted_on_b) = (0u64, 0u64);
        let mut refused = None;
        for _ in 0..(BUDGET / biggest.max(1) + most_on_b + 10) {
            let (reply, tokens) = spend(&b.base).await;
            if reply.status != 200 {
                refused = Some(reply);
                break;
            }
            on_b += tokens;
            admitted_on_b += 1;
            biggest = biggest.max(tokens);
            tokio::time::sleep(PACE).await;
        }
        let refused =
            refused.unwrap_or_else(|| panic!("B never refused the key: it admitted {admitted_on_b} requests"));
        assert_out_of_budget(&refused, "B");
        assert!(
            admitted_on_b <= most_on_b,
            "B admitted {admitted_on_b} requests ({on_b} tokens) after A's spend reached the budget; at most \
             {most_on_b} fit in one exchange period"
        );
        eprintln!(
            "spent {on_a} tokens on A, then B admitted {admitted_on_b} requests ({on_b} tokens) before refusing; \
             budget {BUDGET}, bound {}",
            BUDGET + most_on_b * biggest + biggest
        );
        // The stated bound: budget + (G − 1) × S + F, with F one request (the client sends one at a time).
        let bound = BUDGET + most_on_b * biggest + biggest;
        assert!(on_a + on_b <= bound, "federation-wide spend {} exceeds the bound {bound}", on_a + on_b);
        // And both stay refused.
        assert_out_of_budget(&spend(&fed.base()).await.0, "A");
        assert_out_of_budget(&spend(&b.base).await.0, "B");

        // Another key spends on both gateways at once, each at the client's pace, until both
        // refuse it: the total stays within budget + (G − 1) × S + F.
        let (mut total, mut open) = (0u64, [true, true]);
        let bases = [fed.base(), b.base.clone()];
        for _ in 0..(2 * BUDGET / biggest.max(1) + 2 * most_on_b + 20) {
            for (i, base) in bases.iter().enumerate() {
                if !open[i] {
                    continue;
                }
                let (reply, tokens) = spend_as(base, SHARED).await;
                if reply.status == 200 {
                    total += tokens;
                    biggest = biggest.max(tokens);
                } else {
                    assert_out_of_budget(&reply, if i == 0 { "A" } else { "B" });
                    open[i] = false;
                }
                tokio::time::sleep(PACE / 2).await;
            }
            if open == [false, false] {
                break;
            }
        }
        assert_eq!(open, [false, false], "both gateways refuse the key in the end");
        let bound = BUDGET + most_on_b * biggest + 2 * biggest;
        eprintln!("spent {total} tokens on both gateways at once; budget {BUDGET}, bound {bound}");
        assert!((BUDGET..=bound).contains(&total), "federation-wide spend {total} is not within [{BUDGET}, {bound}]");
    })
    .await;
}
