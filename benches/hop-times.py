#!/usr/bin/env python3
"""Where a request's time goes, hop by hop, from the kernel's scheduler trace.

Run it while `tela-load --concurrency 1` is in a phase (tela or vllm-router, streamed or
not): it records `perf sched` for a few seconds, names every process by its command line
(client, gateway, node, engine, router) and follows each request through the wake-ups
that carry it: the client wakes the gateway, the gateway wakes a node, the node wakes its
engine, and back. Each hop's time is from the moment a process is woken with the request
(or the answer) to the moment it wakes the next one — its scheduling delay plus its own
work, kernel included. Medians, p10 and p90 over every request seen, in microseconds.

    benches/hop-times.py [--seconds 2] [--data perf-sched.data]

Needs `perf` and the right to trace the scheduler (root, or perf_event_paranoid <= -1).
At concurrency 1 only: with several requests in flight the wake-ups interleave.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

# The roles, by what a process's command line contains (the client by its name).
ROLES = [("tela gateway", "G"), ("tela node", "N"), ("engine-sim", "E"), ("vllm-router", "R"), ("vllm::router", "R")]
NAMES = {"C": "client", "G": "gateway", "N": "node", "E": "engine", "R": "vllm-router"}
# The wake-ups that carry one request, for each path, starting with the client's send.
CHAINS = {
    "tela": ["CG", "GN", "NE", "EN", "NG", "GC"],
    "vllm-router": ["CR", "RE", "ER", "RC"],
    "direct": ["CE", "EC"],
}
WAKEUP = re.compile(r"\s*([\d.]+)\s+\[\d+\]\s+(.+?)\s+awakened: (.+?)\s*$")
TASK = re.compile(r"\[(\d+)(?:/(\d+))?\]$")


def roles_now():
    """Process id → role for every process of interest running now."""
    roles = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if comm == "tela-load":
            roles[int(pid)] = "C"
            continue
        for needle, role in ROLES:
            if needle in cmd:
                roles[int(pid)] = role
                break
    return roles


def wakeups(data, roles):
    """(time, "XY") for every wake-up of a process in role Y by one in another role X."""
    out = subprocess.run(
        ["perf", "sched", "timehist", "-i", data, "-w"], capture_output=True, text=True, check=True
    ).stdout
    events = []

    def role(task):
        m = TASK.search(task)
        if not m:
            return None
        return roles.get(int(m.group(2) or m.group(1)))

    for line in out.splitlines():
        m = WAKEUP.match(line)
        if not m:
            continue
        waker, wakee = role(m.group(2)), role(m.group(3))
        if waker and wakee and waker != wakee:
            events.append((float(m.group(1)), waker + wakee))
    return events


def follow(events, chain):
    """The time of each hop of `chain`, for every request that went through all of them."""
    hops = {step: [] for step in chain[1:]}
    i = 0
    while i < len(events):
        if events[i][1] != chain[0]:
            i += 1
            continue
        t, j, times = events[i][0], i + 1, []
        for step in chain[1:]:
            while j < len(events) and events[j][1] not in (step, chain[0]):
                j += 1
            if j == len(events) or events[j][1] != step:
                break
            times.append((events[j][0] - t) * 1e6)
            t, j = events[j][0], j + 1
        if len(times) == len(chain) - 1:
            for step, us in zip(chain[1:], times):
                hops[step].append(us)
            i = j
        else:
            i += 1
    return hops


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="how long to record")
    parser.add_argument("--data", help="where perf writes its trace (default: a temporary file)")
    args = parser.parse_args()
    roles = roles_now()
    if "C" not in roles.values():
        sys.exit("hop-times: no tela-load running; start `tela-load --concurrency 1` first")
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data or os.path.join(tmp, "perf-sched.data")
        subprocess.run(
            ["perf", "sched", "record", "-o", data, "--", "sleep", str(args.seconds)],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        events = wakeups(data, roles)
    # The path the client was on: the one along which the most requests went all the way.
    followed = {path: follow(events, chain) for path, chain in CHAINS.items()}
    best = max(followed, key=lambda path: min(len(v) for v in followed[path].values()))
    hops = followed[best]
    n = min(len(v) for v in hops.values())
    if n == 0:
        sys.exit("hop-times: no complete request seen; is tela-load in a concurrency-1 phase?")
    print(f"path {best}: {n} requests followed; microseconds from being woken to waking the next")
    print(f"{'time in':<40} {'p10':>6} {'p50':>6} {'p90':>6}")
    total = 0.0
    for step, values in hops.items():
        values.sort()
        p50 = statistics.median(values)
        name = f"{NAMES[step[0]]}, until it wakes the {NAMES[step[1]]}"
        print(f"{name:<40} {values[len(values) // 10]:>6.0f} {p50:>6.0f} {values[len(values) * 9 // 10]:>6.0f}")
        if step[0] != "E":
            total += p50
    print(f"{'sum of p50 outside the engine':<40} {'':>6} {total:>6.0f}")


if __name__ == "__main__":
    main()
