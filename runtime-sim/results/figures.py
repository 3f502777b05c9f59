"""The membership figures of tela-sim reports, side by side, as a Markdown table.

    python3 runtime-sim/results/figures.py [--heal S] REPORT.json [REPORT.json ...]

One column per report: wall time, events and their kinds, events per node-second, the
busiest second per node (and the heal's first second with `--heal`), bytes per node-second,
convergence, detection, liveness, memory and the hash. Reports are those `tela-sim run
--report` writes; figures a report lacks (older reports) show as a dash. Peak RSS here is
the report's; `/usr/bin/time -v` gives the kernel's.
"""

import json
import sys


def get(report, *path):
    for key in path:
        if not isinstance(report, dict) or key not in report:
            return None
        report = report[key]
    return report


def num(value, digits=0):
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def rows(report, heal):
    nodes = report["nodes"]
    sim_s = report["sim_s"]
    kinds = report.get("events_by_kind") or {}
    events = report["events"]
    shares = ", ".join(f"{k} {100 * v / events:.0f}%" for k, v in kinds.items()) if kinds else "-"
    seconds = get(report, "seconds", "events") or []
    heal_second = "-"
    if heal is not None and int(heal) < len(seconds):
        heal_second = num(seconds[int(heal)] / nodes, 0)
    busiest = get(report, "seconds", "busiest_per_node")
    busiest_at = get(report, "seconds", "busiest_at_s")
    conv = report["convergence"]
    apart = conv.get("apart_from_partitions") or {}
    most = conv.get("apart_from_partitions_9999") or {}
    det = report["detection"]
    gws = det.get("gateways") or {}
    heap = report.get("heap") or {}
    tables = sorted((heap.get("tables") or {}).items(), key=lambda kv: -kv[1])[:3]
    return [
        ("scenario, seed", f"`{report['scenario']}` {report['seed']}"),
        ("nodes; simulated s", f"{nodes:,}; {sim_s:,.0f}"),
        ("wall s (of it setting up)", f"{num(report['wall_s'], 1)} ({num(report.get('setup_wall_s'), 1)})"),
        ("events; per node-second", f"{events / 1e6:,.2f} M; {events / nodes / sim_s:.1f}"),
        ("events by kind", shares),
        ("busiest second, events per node (at s)", f"{num(busiest, 0)} ({busiest_at if busiest_at is not None else '-'})"),
        ("the heal's first second, events per node", heal_second),
        (
            "bytes per node-second: whole run; steady at the end",
            f"{num(report['bytes_per_node_per_s'])}; {num(report['bytes_per_node_per_s_tail'])}",
        ),
        ("max datagram bytes", num(report["max_datagram_bytes"])),
        (
            "convergence to every node: p50, p99, max ms (changes)",
            f"{num(conv['p50_ms'])}, {num(conv['p99_ms'])}, {num(conv['p100_ms'])} ({conv['count']:,})",
        ),
        (
            "apart from partitions: p50, p99, max ms (changes)",
            f"{num(apart.get('p50_ms'))}, {num(apart.get('p99_ms'))}, {num(apart.get('p100_ms'))} ({apart.get('count', '-')})",
        ),
        ("the same to 99.99%: p50, p99 ms", f"{num(most.get('p50_ms'))}, {num(most.get('p99_ms'))}"),
        ("Serf's 99.99% bound ms", num(conv["serf_bound_ms"])),
        (
            "detection, every node: p50, max ms (kills)",
            f"{num(det['p50_ms'])}, {num(det['p100_ms'])} ({det['count']})",
        ),
        ("detection, every gateway: max ms", num(gws.get("p100_ms"))),
        ("false DOWN; DOWN marks signed", f"{num(det['false_down'])}; {num(det['marks_signed'])}"),
        (
            "live replicas equal after the faults (bound s)",
            f"{num(get(report, 'liveness', 'converged_after_ms'))} ms ({num(get(report, 'liveness', 'bound_s'))})",
        ),
        ("peak RSS MB (the report's)", num(report["peak_rss_mb"])),
        (
            "heap at its peak: live MB at s; largest tables MB",
            f"{num((heap.get('live_bytes') or 0) / 1e6)} at {heap.get('at_s', '-')}; "
            + ", ".join(f"{k} {v / 1e6:,.0f}" for k, v in tables)
            if heap
            else "-",
        ),
        ("hash", f"`{report['hash']}`"),
    ]


def main():
    args = sys.argv[1:]
    heal = None
    if args[:1] == ["--heal"]:
        heal = float(args[1])
        args = args[2:]
    columns = [rows(json.load(open(path)), heal) for path in args]
    print("| | " + " | ".join(path.rsplit("/", 1)[-1] for path in args) + " |")
    print("|---" * (len(args) + 1) + "|")
    for i, (name, _) in enumerate(columns[0]):
        print(f"| {name} | " + " | ".join(col[i][1] for col in columns) + " |")


if __name__ == "__main__":
    main()
