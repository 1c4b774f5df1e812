#!/usr/bin/env python3
"""Write a seeded variant of the ProFaaStinate document pipeline trace
(config/sim/profaastinate-events.txt) for `spillway sim --delay-queue`.

Usage: scripts/profaastinate-events.py SEED [DOCUMENTS] > events.txt

DOCUMENTS (default 900) uploads at Poisson arrivals of one a second on average (the preset
has one every second exactly); per document a synchronous check (100 ms CPU) and three
asynchronous calls 10 ms apart with a 180 s deadline: virus scan (1500 ms), OCR
(2500 ms), e-mail (100 ms). The same SEED gives the same file.
"""
import random
import sys


def main():
    seed = int(sys.argv[1])
    documents = int(sys.argv[2]) if len(sys.argv) > 2 else 900
    rng = random.Random(seed)
    w = sys.stdout.write
    w(f"# ProFaaStinate document pipeline, Poisson uploads (1/s), seed {seed}\n")
    w("time_s kind deadline_s processing_ms\n")
    t, lines = 0.0, []
    for _ in range(documents):
        lines.append((round(t, 3), "sync 0 100"))
        for k, ms in enumerate((1500, 2500, 100), start=1):
            lines.append((round(t + 0.01 * k, 3), f"async 180 {ms}"))
        t += rng.expovariate(1.0)
    # Documents closer than 30 ms interleave: the trace is time-ordered.
    for at, rest in sorted(lines, key=lambda line: line[0]):
        w(f"{at:.3f} {rest}\n")


if __name__ == "__main__":
    main()
