//! [`RegistrySnapshot`]: an immutable copy of a node's registry replica that request handlers,
//! the control socket and tests read while the driver goes on gossiping.

use serde_json::{json, Value};
use std::fmt::Write as _;
use tela_core::{Lifecycle, Node, NodeId, Reachability, Replica, SharedRecord, Stats, Time};

/// The registry as one node saw it at one moment.
#[derive(Clone, Debug)]
pub struct RegistrySnapshot {
    seq: u64,
    taken_at: Time,
    replica: Replica,
    connected: Vec<NodeId>,
    stats: Stats,
}

impl RegistrySnapshot {
    /// A snapshot of `node` at `now`, numbered `seq`.
    pub fn of(node: &Node, now: Time, seq: u64) -> RegistrySnapshot {
        RegistrySnapshot {
            seq,
            taken_at: now,
            replica: node.replica().clone(),
            connected: node.connected_peers().to_vec(),
            stats: node.stats(),
        }
    }

    /// Increases with every published snapshot.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// When it was taken, on the runtime's timeline.
    pub fn taken_at(&self) -> Time {
        self.taken_at
    }

    /// The replica: every known node's record, liveness and the model index.
    pub fn replica(&self) -> &Replica {
        &self.replica
    }

    /// This node's own record.
    pub fn local(&self) -> &SharedRecord {
        self.replica.local()
    }

    /// This node's lifecycle state.
    pub fn state(&self) -> Lifecycle {
        self.replica.local().state
    }

    /// Peers with a live connection.
    pub fn connected(&self) -> &[NodeId] {
        &self.connected
    }

    /// The core's counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// `id`'s record and whether it is routable, if known.
    pub fn record(&self, id: &NodeId) -> Option<(SharedRecord, bool)> {
        self.replica.get(id).map(|s| (s.record().clone(), s.is_routable()))
    }

    /// The snapshot as JSON (what `tela status --json` prints).
    pub fn to_json(&self) -> Value {
        let local = self.local();
        let nodes: Vec<Value> = self
            .replica
            .slots()
            .iter()
            .map(|slot| {
                let r = slot.record();
                json!({
                    "id": hex(&r.id),
                    "short": r.id.to_string(),
                    "generation": r.generation,
                    "state": r.state.as_str(),
                    "role": format!("{:?}", r.role).to_lowercase(),
                    "heartbeat": r.heartbeat,
                    "models": r.models.as_slice().iter().map(|m| m.name.clone()).collect::<Vec<_>>(),
                    "hardware": {
                        "gpu": format!("{:?}", r.hardware.gpu),
                        "gpu_count": r.hardware.gpu_count,
                        "vram_mib": r.hardware.vram_mib,
                        "interconnect": format!("{:?}", r.hardware.interconnect),
                    },
                    "reach": match &r.reach {
                        Reachability::Public(a) => a.clone(),
                        Reachability::OutboundOnly => "outbound-only".to_string(),
                    },
                    "in_flight": r.load.in_flight,
                    "alive": slot.is_alive(),
                    "routable": slot.is_routable(),
                })
            })
            .collect();
        json!({
            "node": hex(&local.id),
            "short": local.id.to_string(),
            "generation": local.generation,
            "state": local.state.as_str(),
            "connected": self.connected.iter().map(hex).collect::<Vec<_>>(),
            "taken_at_us": self.taken_at.as_micros(),
            "registry": nodes,
        })
    }

    /// A table for people (what `tela status` prints).
    pub fn to_table(&self) -> String {
        format_table(&self.to_json())
    }
}

/// The full id in hex (32 digits); [`NodeId`]'s `Display` shows only 8.
pub fn hex(id: &NodeId) -> String {
    id.0.iter().fold(String::with_capacity(32), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Parses a full 32-digit hex id, as printed by [`hex`].
pub fn parse_hex(s: &str) -> Option<NodeId> {
    let s = s.trim();
    if s.len() != 32 || !s.is_ascii() {
        return None;
    }
    let mut id = [0u8; 16];
    for (i, b) in id.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(NodeId(id))
}

/// The "routable" column of a status table row: `yes`, `no` (alive but not routable) or `dead`.
pub fn routable_label(node: &Value) -> &'static str {
    if node["routable"] == true {
        "yes"
    } else if node["alive"] == true {
        "no"
    } else {
        "dead"
    }
}

/// A table for people from the JSON form of a snapshot ([`RegistrySnapshot::to_json`]).
pub fn format_table(s: &Value) -> String {
    let mut out = format!(
        "node {} generation {} {}\n",
        s["short"].as_str().unwrap_or("?"),
        s["generation"],
        s["state"].as_str().unwrap_or("?")
    );
    out.push_str(&format!(
        "{:<9} {:<8} {:<6} {:<9} {:<14} {:>5}  {:<22} models\n",
        "node", "role", "state", "routable", "generation", "load", "reach"
    ));
    for n in s["registry"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let models: Vec<&str> =
            n["models"].as_array().map(|m| m.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
        let routable = routable_label(n);
        out.push_str(&format!(
            "{:<9} {:<8} {:<6} {:<9} {:<14} {:>5}  {:<22} {}\n",
            n["short"].as_str().unwrap_or("?"),
            n["role"].as_str().unwrap_or("?"),
            n["state"].as_str().unwrap_or("?"),
            routable,
            n["generation"].to_string(),
            n["in_flight"].to_string(),
            n["reach"].as_str().unwrap_or("?"),
            models.join(",")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tela_core::{Config, Input, Model};

    #[test]
    fn json_and_table_show_the_local_record() {
        let id = NodeId::from_u64(0xabcd);
        let mut node = Node::new(Config::new(id, 7), Time::ZERO);
        node.handle_input(Time::ZERO, Input::EngineReady { models: vec![Model::named("m1")] });
        let snap = RegistrySnapshot::of(&node, Time::ZERO, 3);
        let j = snap.to_json();
        assert_eq!(j["state"], "SERVE");
        assert_eq!(j["generation"], 7);
        assert_eq!(j["registry"][0]["models"][0], "m1");
        assert_eq!(parse_hex(j["node"].as_str().expect("hex")), Some(id));
        let table = snap.to_table();
        assert!(table.contains("SERVE") && table.contains("m1"), "{table}");
        assert_eq!(parse_hex("xyz"), None);
    }
}
