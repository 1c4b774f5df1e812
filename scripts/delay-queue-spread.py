#!/usr/bin/env python3
"""The delay-queue experiment's spread over seeds and peak intensities
(docs/src/sim/delay-queue.md): for every seed a Poisson variant of the document pipeline
(scripts/profaastinate-events.py), for every intensity the other workload holding that
many of each VM's 4 cores in [300, 500) s, `spillway sim --policy max --delay-queue both`
on the preset's fixed pool of 2 VMs (`sim.max_fixed_vms`).

Usage: scripts/delay-queue-spread.py SPILLWAY [SEEDS] [CORES,...]
  (defaults: 5 seeds, 1,1.5,3 cores)

Prints one markdown row per intensity: min / median / max over the seeds of the
synchronous mean response time inside the peak without and with the queue, the
reduction, the p95 with the queue and the deadline misses.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def spread(xs, fmt):
    return " / ".join(fmt.format(x) for x in (min(xs), statistics.median(xs), max(xs)))


def main():
    spillway = sys.argv[1]
    seeds = range(1, 1 + (int(sys.argv[2]) if len(sys.argv) > 2 else 5))
    intensities = [float(c) for c in (sys.argv[3] if len(sys.argv) > 3 else "1,1.5,3").split(",")]
    print("| other load (cores of 4) | peak mean off, s | peak mean on, s | reduction | peak p95 on, s | misses on (of 2700) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as d:
        for s in seeds:
            with open(f"{d}/t{s}.txt", "w") as f:
                subprocess.run([sys.executable, f"{ROOT}/scripts/profaastinate-events.py", str(s)],
                               stdout=f, check=True)
        for c in intensities:
            off, on, red, p95, miss = [], [], [], [], []
            for s in seeds:
                subprocess.run([spillway, "sim", "--config", f"{ROOT}/config/sim/profaastinate.yaml",
                                "--trace", f"{d}/t{s}.txt", "--format", "events", "--policy", "max",
                                "--delay-queue", "both", "--set", f"sim.cpu_load.cores={c}",
                                "--quiet", "--json", f"{d}/r.json"], check=True)
                r = json.load(open(f"{d}/r.json"))
                a, b = r[0]["run"], r[1]["run"]
                off.append(a["sync_peak_mean_ms"] / 1000)
                on.append(b["sync_peak_mean_ms"] / 1000)
                red.append(100 * (1 - b["sync_peak_mean_ms"] / a["sync_peak_mean_ms"]))
                p95.append(b["sync_peak_p95_ms"] / 1000)
                miss.append(b["deadline_misses"])
            print(f"| {c:g} | {spread(off, '{:.2f}')} | {spread(on, '{:.2f}')} | "
                  f"{spread(red, '{:.0f} %')} | {spread(p95, '{:.2f}')} | {spread(miss, '{:d}')} |")


if __name__ == "__main__":
    main()
