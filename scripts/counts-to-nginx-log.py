#!/usr/bin/env python3
"""Write an nginx `combined` access log (with `$request_time` last) whose requests per
second follow a `counts` trace: the example log of the manual's "Does LIBRA pay for my
API?" walkthrough (docs/src/sim/logs.md).

Usage: scripts/counts-to-nginx-log.py TRACE SECONDS DIVISOR > access.log

The first SECONDS lines of TRACE, each count divided by DIVISOR (remainder carried), as
requests stamped from 2026-12-01T08:00:00Z on, over four routes; `$request_time` is drawn
from a seeded generator (40-400 ms, the thumbnail route slower), so the same arguments give
the same file.
"""
import datetime
import random
import sys


def main():
    trace, seconds, divisor = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    rng = random.Random(7)
    t0 = datetime.datetime(2026, 12, 1, 8, 0, tzinfo=datetime.timezone.utc)
    routes = [("GET", "/api/orders", 0.04, 0.12), ("GET", "/api/orders/{}", 0.04, 0.10),
              ("POST", "/api/orders", 0.08, 0.20), ("GET", "/api/thumb/{}", 0.15, 0.40)]
    cum, out_prev = 0, 0
    w = sys.stdout.write
    with open(trace) as f:
        for s, line in enumerate(f):
            if s >= seconds:
                break
            cum += int(line)
            out = round(cum / divisor)
            n, out_prev = out - out_prev, out
            stamp = (t0 + datetime.timedelta(seconds=s)).strftime("%d/%b/%Y:%H:%M:%S +0000")
            for _ in range(n):
                method, path, lo, hi = routes[rng.randrange(len(routes))]
                path = path.format(rng.randrange(1000))
                rt = rng.uniform(lo, hi)
                w(f'198.51.100.{rng.randrange(1, 255)} - - [{stamp}] "{method} {path} HTTP/1.1" '
                  f'200 {rng.randrange(200, 5000)} "-" "example-client/1.0" {rt:.3f}\n')


if __name__ == "__main__":
    main()
