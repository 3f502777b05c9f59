//! The seed corpus in `corpus/<target>/`: how each seed is built, a test that each does what its
//! name says, and a test that the committed files match their builders, which rewrites them
//! when asked:
//!
//! ```text
//! TELA_WRITE_SEEDS=1 cargo test -p tela-fuzz --lib committed_seeds_match_their_builders
//! ```

use crate::facade::{drive, op, OWN};
use std::path::Path;
use tela_core::harness::wire::{self, Builder, Piggyback, ProbeBuilder};
use tela_core::{
    FabricId, GpuModel, Hardware, Identity, Lifecycle, Load, Model, ModelSet, NodeId, Quantization, Reachability,
    Record, Role,
};
use tela_core::{MAX_DATAGRAM, WIRE_VERSION};

/// Named seeds of one target.
type Seeds = Vec<(&'static str, Vec<u8>)>;

/// A `node_facade` input, written in the layout `facade` reads.
struct Script(Vec<u8>);

/// Config bytes (see `facade::config`): all defaults, public.
const PUBLIC: [u8; 12] = [2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
/// Public, with 100 ms protocol periods.
const FAST_PROBES: [u8; 12] = [2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10];

impl Script {
    fn new(config: [u8; 12]) -> Script {
        Script(config.to_vec())
    }

    fn op(mut self, code: u8, params: &[u8]) -> Script {
        self.0.push(code);
        self.0.extend_from_slice(params);
        self
    }

    /// `n` timeouts, each at the node's deadline.
    fn timeouts(mut self, n: usize) -> Script {
        for _ in 0..n {
            self = self.op(op::TIMEOUT_AT_DEADLINE, &[]);
        }
        self
    }

    fn after_ms(self, ms: u16) -> Script {
        let [lo, hi] = (ms / 4).to_le_bytes();
        self.op(op::TIMEOUT_AFTER, &[lo, hi])
    }

    /// The engine is ready with pooled models (`facade::pooled_model`'s bytes, below 0xc0).
    fn engine_ready(self, models: &[u8]) -> Script {
        let mut p = vec![models.len() as u8];
        p.extend_from_slice(models);
        self.op(op::ENGINE_READY, &p)
    }

    /// The engine is ready with "llama" and a model called `name`, whatever its bytes.
    fn engine_ready_with_name(self, name: &[u8]) -> Script {
        let mut p = vec![2, 0, 0xc0, name.len() as u8];
        p.extend_from_slice(name);
        self.op(op::ENGINE_READY, &p)
    }

    /// A `Records` datagram from node `from` carrying `records` (each from [`peer`]).
    fn records(self, from: u64, records: &[Vec<u8>]) -> Script {
        let mut p = vec![(from - 1) as u8, (records.len() - 1) as u8];
        for r in records {
            p.extend_from_slice(r);
        }
        self.op(op::RECORDS, &p)
    }

    fn bytes(self) -> Vec<u8> {
        self.0
    }
}

/// A peer record in `facade::peer_record`'s layout: SERVE, public, with GPUs, `models` as
/// pooled-model bytes (0 is "llama", 1 "qwen", ...).
fn peer(id: u64, generation: u8, state: Lifecycle, heartbeat: u16, models: &[u8]) -> Vec<u8> {
    let [lo, hi] = heartbeat.to_le_bytes();
    let mut p = vec![(id - 1) as u8, generation, state as u8, lo, hi, 0b110];
    p.push(models.len() as u8);
    p.extend_from_slice(models);
    p.push(0);
    p
}

/// `peer` with extra flag bits: 8 has the next peer mark it DOWN, 16 leaves it unsigned.
fn peer_flagged(id: u64, state: Lifecycle, heartbeat: u16, models: &[u8], flags: u8) -> Vec<u8> {
    let mut p = peer(id, 1, state, heartbeat, models);
    p[5] |= flags;
    p
}

/// The `node_facade` seeds, by name.
fn node_scripts() -> Seeds {
    let serving = || {
        Script::new(PUBLIC)
            .engine_ready(&[0, 1])
            .op(op::CONNECT, &[2])
            .records(2, &[peer(2, 1, Lifecycle::Serve, 7, &[0, 2])])
    };
    // Item layouts of `facade::piggyback`: a suspicion (raised just now), and a record.
    let suspect = |id: u64, own_generation: bool, heartbeat: u16, from: u64| {
        let [lo, hi] = heartbeat.to_le_bytes();
        vec![0, (id - 1) as u8, if own_generation { 4 } else { 1 }, lo, hi, (from - 1) as u8, 0, 0]
    };
    let record = |r: Vec<u8>| [vec![1], r].concat();
    // An announcement of node `id`'s record at generation 1 in `state` (its index in the
    // facade's list) and `heartbeat`.
    let have = |id: u64, state: u8, heartbeat: u16| {
        let [lo, hi] = heartbeat.to_le_bytes();
        vec![2, (id - 1) as u8, 1, state, lo, hi]
    };
    let probe = |from: u64, kind: u8, seq: u16, target: u64, items: &[Vec<u8>]| {
        let [lo, hi] = seq.to_le_bytes();
        let mut p = vec![(from - 1) as u8, kind, lo, hi, (target - 1) as u8, items.len() as u8];
        p.extend(items.concat());
        p
    };
    let mut drain_config = PUBLIC;
    drain_config[8] = 40; // 10 s drain window
    drain_config[9] = 10; // 200 ms linger
    let mut top_generation = PUBLIC;
    top_generation[0] |= 1 << 2; // generation u64::MAX - g % 4
    let mut small = PUBLIC;
    small[10] = 14; // 256-byte datagrams
    small[4] = 5; // gossip fanout 5
    vec![
        (
            "serve_and_gossip",
            serving()
                .timeouts(3)
                .op(op::ANNOUNCE, &[2, 1, 2, 3, 1, 200, 0, 4, 1, 1, 9, 0])
                .op(op::WANT, &[1, 2, 0, 1, 5])
                .timeouts(2)
                .bytes(),
        ),
        (
            "false_down_is_refuted",
            serving()
                .timeouts(8)
                .op(op::OWN_ECHO, &[1, 1, 0])
                .timeouts(3)
                .op(op::OWN_ECHO, &[2, 2, 0])
                .op(op::OWN_ECHO, &[1, 5, 3])
                .op(op::OWN_ECHO, &[1, 0, 0])
                .timeouts(5)
                .bytes(),
        ),
        (
            "drain_to_exit",
            Script::new(drain_config)
                .engine_ready(&[0])
                .op(op::CONNECT, &[3])
                .op(op::LOAD, &[1])
                .timeouts(5)
                .op(op::WALLTIME, &[0, 50, 0])
                .after_ms(6_000)
                .op(op::ENGINE_READY, &[1, 2])
                .op(op::LOAD, &[4])
                .timeouts(12)
                .op(op::ENGINE_READY, &[1, 0])
                .op(op::OWN_ECHO, &[2, 1, 0])
                .timeouts(2)
                .bytes(),
        ),
        (
            "peer_dies_and_returns",
            serving()
                .records(3, &[peer(3, 1, Lifecycle::Serve, 1, &[1])])
                .after_ms(7_000)
                .timeouts(2)
                .records(3, &[peer(3, 1, Lifecycle::Serve, 2, &[1, 4])])
                .timeouts(2)
                .records(4, &[peer(3, 2, Lifecycle::Serve, 0, &[4]), peer(4, 0, Lifecycle::Down, 3, &[0])])
                .timeouts(3)
                .bytes(),
        ),
        (
            "engine_reports_bad_names",
            Script::new(PUBLIC)
                .engine_ready_with_name(b"")
                .timeouts(4)
                .engine_ready_with_name(&[b'x'; 120])
                .op(op::ENGINE_FAILED, &[])
                .engine_ready(&[3])
                .timeouts(4)
                .bytes(),
        ),
        (
            "top_generation",
            Script::new(top_generation)
                .engine_ready(&[1])
                .op(op::OWN_ECHO, &[1, 6, 0])
                .op(op::OWN_ECHO, &[1, 2, 0])
                .op(op::OWN_ECHO, &[1, 5, 9])
                .timeouts(4)
                .op(op::DRAIN, &[])
                .timeouts(10)
                .bytes(),
        ),
        (
            "small_datagrams_many_peers",
            Script::new(small)
                .engine_ready(&[0, 1, 2, 3, 4, 5])
                .records(2, &[peer(2, 1, Lifecycle::Serve, 1, &[0, 1, 2, 3])])
                .records(3, &[peer(3, 1, Lifecycle::Serve, 1, &[5, 6, 7, 8])])
                .records(4, &[peer(4, 1, Lifecycle::Join, 1, &[9])])
                .records(5, &[peer(5, 1, Lifecycle::Serve, 1, &[10, 11])])
                .op(op::WANT, &[2, 4, 0, 1, 2, 3, 4])
                .timeouts(20)
                .op(op::TIMEOUT_STALE, &[0, 4])
                .op(op::DISCONNECT, &[2])
                .bytes(),
        ),
        (
            "swim_probes_and_refutes",
            Script::new(FAST_PROBES)
                .engine_ready(&[0])
                .op(op::CONNECT, &[2])
                .op(op::PROBE, &probe(2, 4, 0, 2, &[record(peer(2, 1, Lifecycle::Serve, 3, &[1]))]))
                .op(op::PROBE, &probe(3, 4, 0, 3, &[record(peer(3, 1, Lifecycle::Serve, 1, &[2]))]))
                .timeouts(12)
                .op(op::PROBE, &probe(2, 0, 7, 2, &[suspect(3, false, 1, 2)]))
                .op(op::PROBE, &probe(3, 1, 8, 2, &[suspect(1, true, 5, 3)]))
                .op(op::PROBE, &probe(2, 2, 0, 2, &[]))
                .op(op::PROBE, &probe(3, 3, 1, 2, &[suspect(2, false, 3, 3), suspect(2, false, 3, 4)]))
                .timeouts(60)
                .after_ms(30_000)
                .timeouts(20)
                .op(op::DISCONNECT, &[2])
                .timeouts(20)
                .bytes(),
        ),
        (
            "swim_announcements_fetched",
            Script::new(FAST_PROBES)
                .engine_ready(&[0])
                .op(op::PROBE, &probe(2, 4, 0, 2, &[record(peer(2, 1, Lifecycle::Serve, 3, &[1]))]))
                .op(op::PROBE, &probe(3, 4, 0, 3, &[have(2, 1, 9), have(4, 1, 1), have(2, 1, 2)]))
                .timeouts(8)
                .op(op::WANT, &[2, 128, 0, 1, 2])
                .timeouts(8)
                .bytes(),
        ),
        (
            "forgeries_change_nothing",
            serving()
                .records(3, &[peer_flagged(2, Lifecycle::Serve, 900, &[1, 4], 16)])
                .records(3, &[peer_flagged(4, Lifecycle::Serve, 2, &[0], 16)])
                .records(3, &[peer_flagged(2, Lifecycle::Serve, 1, &[1], 8)])
                .op(op::OWN_ECHO, &[3, 9, 0])
                .timeouts(4)
                .bytes(),
        ),
        (
            "malformed_datagrams",
            Script::new(PUBLIC)
                .op(op::RAW_DATAGRAM, &[1, 3, 0, 1, 9, 9])
                .op(op::RAW_DATAGRAM, &[1, 2, 0, 7, 0])
                .op(op::MUTATED, &[2, 1, 1, 1, 5, 0, 6, 2, 0, 1, 0, 1, 0, 0x40])
                .timeouts(3)
                .bytes(),
        ),
    ]
}

/// A realistic serving record of node `n`.
fn realistic(n: u64, models: &[&str]) -> Record {
    let mut hardware = Hardware::catalog(GpuModel::A100_80, 4);
    hardware.fabric = FabricId(3);
    let mut r = Record::new(
        NodeId::from_u64(n),
        1_760_000_000_000 + n,
        Role::Serving,
        hardware,
        Reachability::Public(format!("10.2.{}.{}:7946", n / 256, n % 256)),
    );
    r.state = Lifecycle::Serve;
    r.heartbeat = 300 + n;
    r.load = Load { in_flight: 3, queued: 1 };
    r.models = ModelSet::from_models(
        models.iter().map(|m| Model { name: (*m).to_string(), quant: Quantization::Bf16 }).collect(),
    );
    Identity::for_test(r.id).seal(&mut r);
    r
}

/// The `wire_decode` seeds: one datagram of each kind, and a few rejects.
fn wire_seeds() -> Seeds {
    let mut records = Builder::<Record>::new(MAX_DATAGRAM);
    for n in 1.. {
        if !records.push(&realistic(n, &["meta-llama/Llama-3.1-8B-Instruct", "qwen2.5-7b"])) {
            break;
        }
    }
    let mut want = Builder::<NodeId>::new(MAX_DATAGRAM);
    for n in [3, 70_000, u64::MAX] {
        want.push(&NodeId::from_u64(n));
    }
    let mut fetch = Builder::fetch(MAX_DATAGRAM);
    for n in [3, 70_000, u64::MAX] {
        fetch.push(&NodeId::from_u64(n));
    }
    let mut announcements = ProbeBuilder::gossip(MAX_DATAGRAM);
    for n in 1.. {
        let r = realistic(n, &[]);
        if !announcements.push(&Piggyback::Have { id: r.id, version: r.version() }) {
            break;
        }
    }
    let mut down = realistic(9, &["m"]);
    down.reach = Reachability::OutboundOnly;
    down.hardware = Hardware::CPU;
    Identity::for_test(down.id).seal(&mut down);
    let down = down.with_down_mark(Identity::for_test(NodeId::from_u64(4)).mark_down(&down));
    let one = wire::encode_unbounded(&wire::Message::Records(vec![down]));
    let mut ping = ProbeBuilder::ping(MAX_DATAGRAM, 70_000);
    ping.push(&Piggyback::Suspect {
        id: NodeId::from_u64(4),
        generation: 1_760_000_000_004,
        heartbeat: 304,
        from: NodeId::from_u64(5),
        age: 150,
    });
    ping.push(&Piggyback::Record(realistic(6, &["qwen2.5-7b"])));
    let mut gossip = ProbeBuilder::gossip(MAX_DATAGRAM);
    for n in 1.. {
        if !gossip.push(&Piggyback::Record(realistic(n, &["meta-llama/Llama-3.1-8B-Instruct"]))) {
            break;
        }
    }
    let hashes: Vec<u32> = (0..256u32).map(|b| b.wrapping_mul(0x9e37_79b9)).collect();
    let mut entries = wire::EntriesBuilder::new(MAX_DATAGRAM, 64);
    for bucket in 0..64u16 {
        let listed: Vec<wire::BucketEntry> = (0..3u64)
            .map(|k| wire::BucketEntry {
                id: NodeId::from_u64(u64::from(bucket) * 3 + k),
                hash: [bucket as u8, 1, 2, 3],
            })
            .collect();
        if !entries.push_bucket(bucket, &listed) {
            break;
        }
    }
    vec![
        ("buckets", wire::encode_buckets(1024, 256, &hashes).to_vec()),
        ("bucket_entries", entries.finish().to_vec()),
        ("ping", ping.finish().to_vec()),
        ("ping_req", ProbeBuilder::ping_req(MAX_DATAGRAM, NodeId::from_u64(8), 3).finish().to_vec()),
        ("ack", ProbeBuilder::ack(MAX_DATAGRAM, 3).finish().to_vec()),
        ("nack", ProbeBuilder::nack(MAX_DATAGRAM, 3).finish().to_vec()),
        ("gossip_full", gossip.finish().to_vec()),
        ("records_full", records.finish().to_vec()),
        ("records_one_outbound", one),
        ("want", want.finish().to_vec()),
        ("fetch", fetch.finish().to_vec()),
        ("gossip_announcements", announcements.finish().to_vec()),
        ("records_empty", vec![WIRE_VERSION, 1, 0]),
        ("unknown_version", vec![9, 0, 0]),
        ("previous_version", vec![1, 2, 1, 0]),
        ("truncated", vec![WIRE_VERSION, 2, 3, 0]),
    ]
}

/// The `merge_laws` seeds: a few byte patterns that give colliding versions.
fn merge_seeds() -> Seeds {
    let mut lcg = 0x2545_f491_4f6c_dd1d_u64;
    let noise: Vec<u8> = (0..160)
        .map(|_| {
            lcg = lcg.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (lcg >> 56) as u8
        })
        .collect();
    vec![
        ("zeros", vec![0; 96]),
        ("counting", (0..=255).collect()),
        ("high", vec![0xff; 96]),
        ("noise", noise),
        ("alternating", [0x55, 0xaa].repeat(64)),
    ]
}

fn all_seeds() -> Vec<(&'static str, Seeds)> {
    vec![("wire_decode", wire_seeds()), ("merge_laws", merge_seeds()), ("node_facade", node_scripts())]
}

#[test]
fn scripted_seeds_do_what_their_names_say() {
    let scripts: std::collections::BTreeMap<_, _> = node_scripts().into_iter().collect();
    let run = |name: &str| drive(&scripts[name]);

    let r = run("serve_and_gossip");
    assert!(r.node.replica().serving("llama").contains(&OWN));
    assert!(r.routable.contains(&NodeId::from_u64(2)));

    let r = run("false_down_is_refuted");
    assert!(r.node.local_record().generation > 1 + 1);
    assert_eq!(r.node.local_record().state, Lifecycle::Serve);

    assert!(run("drain_to_exit").node.has_exited());

    let r = run("peer_dies_and_returns");
    assert!(r.flips >= 3, "only {} routability flips", r.flips);
    assert!(r.node.replica().serving("gemma").contains(&NodeId::from_u64(3)));

    let r = run("engine_reports_bad_names");
    assert!(r.node.local_record().validate().is_ok());
    assert_eq!(r.node.local_record().state, Lifecycle::Serve);

    let r = run("top_generation");
    assert_eq!(r.node.local_record().generation, u64::MAX);
    assert!(r.node.has_exited());

    let r = run("small_datagrams_many_peers");
    assert_eq!(r.node.replica().len(), 5);
    assert!(r.node.stats().datagrams_out > 20);

    assert!(run("malformed_datagrams").rejected >= 3);

    let r = run("forgeries_change_nothing");
    let s = r.node.stats();
    assert_eq!(s.records_forged, 3, "{s:?}");
    assert_eq!(s.refutations, 0, "a forged echo made the node refute");
    assert!(r.node.replica().get(&NodeId::from_u64(4)).is_none());
    let two = r.node.replica().get(&NodeId::from_u64(2)).map(|s| s.record().clone());
    assert_eq!(
        two.map(|t| (t.state, t.heartbeat < 900)),
        Some((Lifecycle::Down, true)),
        "forged, or the mark not taken"
    );

    let r = run("swim_announcements_fetched");
    let s = r.node.stats();
    assert_eq!(s.records_fetched, 2, "nodes 2 (a later version) and 4 (unknown) are fetched: {s:?}");

    let r = run("swim_probes_and_refutes");
    let s = r.node.stats();
    assert!(s.suspicions_refuted >= 1, "the suspicion of the node itself was not refuted: {s:?}");
    assert!(s.suspicions_raised >= 1 && s.confirmed_down >= 1, "peers never suspected and confirmed: {s:?}");
    assert_eq!(r.node.local_record().generation, 1, "a refuted suspicion needs no new generation");
}

/// Checks that every committed seed is what its builder makes; with `TELA_WRITE_SEEDS=1` it
/// rewrites the files instead (after a seed or the wire format changed).
#[test]
fn committed_seeds_match_their_builders() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let rewrite = std::env::var_os("TELA_WRITE_SEEDS").is_some();
    for (target, seeds) in all_seeds() {
        let target_dir = dir.join(target);
        for (name, bytes) in seeds {
            let path = target_dir.join(name);
            if rewrite {
                std::fs::create_dir_all(&target_dir).expect("create the corpus directory");
                std::fs::write(&path, &bytes).expect("write a seed");
                continue;
            }
            let on_disk = std::fs::read(&path)
                .unwrap_or_else(|e| panic!("{}: {e}; rewrite the corpus with TELA_WRITE_SEEDS=1", path.display()));
            assert!(on_disk == bytes, "{} is stale; rewrite the corpus with TELA_WRITE_SEEDS=1", path.display());
        }
    }
}
