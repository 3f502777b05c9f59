//! Walltime-aware handover: a node whose walltime is near gets no new conversations. One
//! `--handover-window` before its drain it tells the gateways it is leaving (still SERVE, shown
//! in `/status`), and the next turn of a conversation it held goes to the conversation's
//! next-ranked node — where it stays once the leaving node has drained and gone.

use crate::common;

use std::time::Duration;

use common::*;
use serde_json::Value;

/// The gateway's `/status` row of node `i`.
fn row(fed: &Fed, i: usize) -> Value {
    fed.node_row(i).unwrap_or_else(|| panic!("node {i} is not in /status: {:#}", fed.gateway.status()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_moves_once_before_its_node_leaves_and_stays_where_it_went() {
    within(150, async {
        let mut fed = Fed::start(Options { engines: vec![], ..Options::default() }).await;
        // Node 0's allocation ends 50 s after it starts; with the 20 s drain window of these
        // tests it drains from 30 s, and hands over 15 s before that: from 15 s on.
        fed.add_node(engine(&[MODEL]), &["--walltime", "50s", "--handover-window", "15s"]).await;
        fed.add_node(engine(&[MODEL]), &[]).await;
        fed.wait_routable(2).await;
        let base = fed.base();
        let (leaving, staying) = (fed.nodes[0].id.to_string(), fed.nodes[1].id.to_string());
        let on_leaving: Vec<usize> = (0..1000).filter(|&i| ranking(&fed, i)[0] == leaving).take(2).collect();
        assert_eq!(on_leaving.len(), 2, "some conversations rank node 0 first");

        // Before the window: the conversation is where the rule ranks it, on node 0.
        assert_eq!(row(&fed, 0)["handing_over"], false, "{:#}", row(&fed, 0));
        let (mut messages, first) = opening(on_leaving[0]);
        let node = next_turn(&base, &mut messages, &first).await;
        assert_eq!(node, leaving, "turn 1 went to its first-ranked node (is node 0 handing over already?)");
        assert_eq!(next_turn(&base, &mut messages, "And then?").await, leaving);

        // The window opens: node 0 still serves and is routable, but says it is leaving.
        let handing_over = eventually(Duration::from_secs(30), || row(&fed, 0)["handing_over"] == true).await;
        let now = row(&fed, 0);
        assert!(handing_over, "node 0 hands over: {now:#}\nnode log:\n{}", fed.nodes[0].log_text());
        assert_eq!(now["state"], "SERVE", "{now:#}");
        assert_eq!(now["routable"], true, "{now:#}");
        let left = now["leaving_in_ms"].as_u64().expect("leaving_in_ms while handing over");
        assert!(left <= 15_000, "the drain starts within the handover window: {now:#}");
        assert_eq!(row(&fed, 1)["handing_over"], false, "node 1 has no walltime");
        let table = tela_gateway::status::format_table(&fed.gateway.status());
        assert!(table.contains("leaving"), "the terminal table shows it:\n{table}");

        // The next turn moves to node 1, and so does a conversation that starts now, though
        // both rank node 0 first.
        assert_eq!(next_turn(&base, &mut messages, "Go on.").await, staying, "the turn after the handover began");
        let (mut other, other_first) = opening(on_leaving[1]);
        assert_eq!(next_turn(&base, &mut other, &other_first).await, staying, "a new conversation");
        assert_eq!(next_turn(&base, &mut messages, "More, please.").await, staying);

        // Node 0 drains, leaves and exits; the conversation stays on node 1.
        let gone = eventually(Duration::from_secs(40), || row(&fed, 0)["routable"] == false).await;
        assert!(gone, "node 0 drained: {:#}\nnode log:\n{}", row(&fed, 0), fed.nodes[0].log_text());
        assert_eq!(fed.nodes[0].wait_exit(Duration::from_secs(30)).await, Some(0), "{}", fed.nodes[0].log_text());
        for round in 0..3 {
            let node = next_turn(&base, &mut messages, &format!("Once more ({round}).")).await;
            assert_eq!(node, staying, "turn {round} after node 0 left moved again");
        }
        assert_eq!(next_turn(&base, &mut other, "And?").await, staying);
    })
    .await;
}
