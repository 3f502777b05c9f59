"""Convergence by phase of a run with one partition, from a tela-sim report.

    python3 runtime-sim/results/phases.py REPORT.json CUT_S HEAL_S

Reads `convergence.changes` (when each change began; ms until every live node held it; and,
in reports since the triples were added, ms until 99.99% of them did) and prints the count,
p50, p99 and max of the changes that finished before the cut, those that spread while it was
in force, and those that began 0-30 s, 30-60 s and over 60 s after the heal; then the last of
these split into 60-120 s, 120-180 s and over 180 s after the heal, and when the last change
slower than Serf's 99.99% bound began. Each line gives the times to every node and, where the
report has them, to 99.99% of the nodes. Quantiles are taken as `tela-sim` takes them
(nearest rank on (n - 1) * q).
"""

import json
import sys


def quantile(values, q):
    values = sorted(values)
    return values[round((len(values) - 1) * q)] if values else 0.0


def main():
    report = json.load(open(sys.argv[1]))
    cut, heal = float(sys.argv[2]), float(sys.argv[3])
    # (began s, ms to every node, ms to 99.99% or None in reports of pairs)
    changes = [(c[0], c[1], c[2] if len(c) > 2 else None) for c in report["convergence"]["changes"]]
    phases = [
        ("finished before the cut", lambda t, ms: t + ms / 1e3 < cut),
        ("spread while the cut was in force", lambda t, ms: t + ms / 1e3 >= cut and t <= heal),
        ("began 0-30 s after the heal", lambda t, ms: heal < t <= heal + 30),
        ("began 30-60 s after the heal", lambda t, ms: heal + 30 < t <= heal + 60),
        ("began over 60 s after the heal", lambda t, ms: t > heal + 60),
        ("  of those, 60-120 s after", lambda t, ms: heal + 60 < t <= heal + 120),
        ("  of those, 120-180 s after", lambda t, ms: heal + 120 < t <= heal + 180),
        ("  of those, over 180 s after", lambda t, ms: t > heal + 180),
    ]
    for name, inside in phases:
        kept = [(m, most) for t, m, most in changes if inside(t, m)]
        ms = [m for m, _ in kept]
        line = (
            f"{name}: {len(ms)} changes, p50 {quantile(ms, 0.5):.0f} ms, "
            f"p99 {quantile(ms, 0.99):.0f} ms, max {max(ms, default=0):.0f} ms"
        )
        most = [m for _, m in kept if m is not None]
        if most:
            line += (
                f"; to 99.99%: p50 {quantile(most, 0.5):.0f} ms, "
                f"p99 {quantile(most, 0.99):.0f} ms, max {max(most):.0f} ms"
            )
        print(line)
    bound = report["convergence"]["serf_bound_ms"]
    print(f"Serf's 99.99% bound: {bound:.0f} ms")
    slow = [t for t, ms, _ in changes if ms > bound]
    if slow:
        print(f"last change slower than the bound began at {max(slow):.1f} s")


if __name__ == "__main__":
    main()
