#!/usr/bin/env python3
"""Call scheduling on one overloaded VM (docs/src/design/papers.md §4): generate `events`
traces of a function mix at 70-130 % of the VM's capacity, run `spillway sim` with
config/sim/callsched.yaml once per load and queue order, and print the README tables.

    python3 scripts/callsched-sweep.py [--spillway PATH] [--out DIR] [--seconds 120]

The mix (function, mean processing time, share of calls) spans three orders of
magnitude, 5 ms to 5 s. Its function kinds follow the SeBS serverless benchmark suite
(Copik et al., Middleware 2021), which the call-scheduling paper's workloads also draw
on: dynamic HTML, thumbnailer, compression, video processing. The numbers are ours,
round orders of magnitude, not measurements. Each call's processing time is lognormal
around its function's mean (sigma 0.25, mean-preserving). Arrivals are Poisson at
load x slots / E[p] calls/s; seeds are fixed, so the tables are reproducible.
"""
import argparse
import json
import math
import os
import random
import subprocess
import sys

MIX = [  # (name, mean processing ms, share of calls)
    ("html", 5.0, 0.40),
    ("thumb", 50.0, 0.30),
    ("compress", 500.0, 0.20),
    ("video", 5000.0, 0.10),
]
SLOTS = 4  # sim.vm.slots in config/sim/callsched.yaml
SIGMA = 0.25
LOADS = [0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3]
ORDERS = ["fifo", "sept", "eect", "rect", "fair_choice"]


def mean_p_ms():
    return sum(m * s for _, m, s in MIX)


def trace(path, load, seconds, seed):
    rng = random.Random(seed)
    rate = load * SLOTS / (mean_p_ms() / 1000.0)
    names = [n for n, _, _ in MIX]
    weights = [s for _, _, s in MIX]
    means = {n: m for n, m, _ in MIX}
    t = 0.0
    n = 0
    with open(path, "w") as f:
        while True:
            t += rng.expovariate(rate)
            if t >= seconds:
                break
            fn = rng.choices(names, weights)[0]
            mu = math.log(means[fn]) - SIGMA * SIGMA / 2
            p = rng.lognormvariate(mu, SIGMA)
            f.write(f"{t:.6f} fn={fn} p_ms={p:.3f}\n")
            n += 1
    return n


def run(spillway, config, trace_path, order, json_path):
    subprocess.run(
        [spillway, "sim", "--config", config, "--format", "events", "--trace", trace_path,
         "--policy", "libra", "--queue-order", order, "--json", json_path],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(json_path) as f:
        return json.load(f)["policies"][0]["queue"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spillway", default="target/release/spillway")
    ap.add_argument("--config", default="config/sim/callsched.yaml")
    ap.add_argument("--out", default="traces/callsched")
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    res = {}
    for load in LOADS:
        tp = os.path.join(a.out, f"callsched-{round(load * 100)}.txt")
        n = trace(tp, load, a.seconds, a.seed)
        for order in ORDERS:
            jp = os.path.join(a.out, f"r-{round(load * 100)}-{order}.json")
            res[(load, order)] = run(a.spillway, a.config, tp, order, jp)
        print(f"load {load:.0%}: {n} calls", file=sys.stderr)

    print(f"Mix: E[p] = {mean_p_ms():.0f} ms; capacity {SLOTS / mean_p_ms() * 1000:.2f} calls/s; "
          f"{a.seconds:.0f} s of arrivals per load, seed {a.seed}.\n")
    print("Mean response time, ms (median) by load and order:\n")
    print("| load | " + " | ".join(ORDERS) + " | FIFO/SEPT | FIFO/FC |")
    print("|---|" + "---|" * (len(ORDERS) + 2))
    for load in LOADS:
        r = {o: res[(load, o)]["response_ms"] for o in ORDERS}
        cells = [f"{r[o]['mean']:.0f} ({r[o]['p50']:.0f})" for o in ORDERS]
        print(f"| {load:.0%} | " + " | ".join(cells)
              + f" | {r['fifo']['mean'] / r['sept']['mean']:.1f} "
              + f"| {r['fifo']['mean'] / r['fair_choice']['mean']:.1f} |")
    print("\nMean stretch (median) by load and order:\n")
    print("| load | " + " | ".join(ORDERS) + " | FIFO/SEPT | FIFO/FC |")
    print("|---|" + "---|" * (len(ORDERS) + 2))
    for load in LOADS:
        r = {o: res[(load, o)]["stretch"] for o in ORDERS}
        cells = [f"{r[o]['mean']:.1f} ({r[o]['p50']:.1f})" for o in ORDERS]
        print(f"| {load:.0%} | " + " | ".join(cells)
              + f" | {r['fifo']['mean'] / r['sept']['mean']:.1f} "
              + f"| {r['fifo']['mean'] / r['fair_choice']['mean']:.1f} |")
    print("\nAt 110 % load, per function: response time ms mean [p25, p50, p75] / stretch mean:\n")
    print("| function | " + " | ".join(ORDERS) + " |")
    print("|---|" + "---|" * len(ORDERS))
    for name, _, _ in MIX:
        cells = []
        for o in ORDERS:
            fns = dict((n, f) for n, f in res[(1.1, o)]["functions"])
            f = fns[name]
            rr, s = f["response_ms"], f["stretch"]
            cells.append(f"{rr['mean']:.0f} [{rr['p25']:.0f}, {rr['p50']:.0f}, {rr['p75']:.0f}] / {s['mean']:.1f}")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
