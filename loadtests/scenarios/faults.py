#!/usr/bin/env python3
"""Fault scenarios on loopback, each under a steady open-loop GET load:

  vm-kill   a static pool of two `spillway sample-api` VMs; one is killed (SIGKILL)
            a third of the way in. Goal: 0 failed GETs.
  reload    one VM; the gateway gets SIGHUP (configuration reload) every second.
            Goal: 0 dropped requests.

  loadtests/scenarios/faults.py vm-kill|reload [--spillway PATH] [--rate R] [--seconds S]

Prints the requests sent, the answers by status and the failures (any non-200 or
connection error).
"""
import argparse, collections, http.client, os, signal, socket, subprocess, sys, tempfile
import threading, time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start_api(spillway, name):
    port = free_port()
    p = subprocess.Popen([spillway, "sample-api", "--listen", f"127.0.0.1:{port}", "--name", name],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port)).close()
            return p, port
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("sample API did not listen")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", choices=["vm-kill", "reload"])
    ap.add_argument("--spillway", default=os.environ.get("SPILLWAY", "target/release/spillway"))
    ap.add_argument("--rate", type=float, default=30.0)
    ap.add_argument("--seconds", type=float, default=15.0)
    a = ap.parse_args()
    apis = [start_api(a.spillway, "a")]
    if a.scenario == "vm-kill":
        apis.append(start_api(a.spillway, "b"))
    urls = ", ".join(f'"http://127.0.0.1:{port}"' for _, port in apis)
    d = tempfile.mkdtemp()
    cfg = os.path.join(d, "g.yaml")
    with open(cfg, "w") as f:
        f.write(f"""gateway:
  listen: 127.0.0.1:0
  admin_listen: 127.0.0.1:0
  allow_loopback_upstreams: true
  health_check_interval_seconds: 0.5
libra: {{decision_epochs: 1000, r_max_rps: 1000, rho: 1.0}}
vm_pool: {{type: static, urls: [{urls}]}}
function_tier:
  type: process
  command: ["{a.spillway}", "sample-api", "--listen", "127.0.0.1:{{port}}", "--name", "fn"]
  max_instances: 4
""")
    gw = subprocess.Popen([a.spillway, "serve", "--config", cfg], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, env={**os.environ, "RUST_LOG": "info"})
    log = []
    listening = threading.Event()
    proxy = {}

    def read_log():
        for line in gw.stderr:
            log.append(line)
            if "spillway listening" in line:
                proxy["addr"] = line.split("proxy=")[1].split()[0]
                listening.set()

    threading.Thread(target=read_log, daemon=True).start()
    if not listening.wait(30):
        raise RuntimeError("gateway did not start")
    host, port = proxy["addr"].rsplit(":", 1)
    results = collections.Counter()
    lock = threading.Lock()

    def one(i):
        try:
            c = http.client.HTTPConnection(host, int(port), timeout=30)
            c.request("GET", f"/sleep?ms=50&i={i}")
            status = c.getresponse().status
            c.close()
        except Exception as e:  # noqa: BLE001 - any failure counts
            status = type(e).__name__
        with lock:
            results[status] += 1

    n = int(a.rate * a.seconds)
    start = time.time()
    threads = []
    fault_at = a.seconds / 3
    faulted = False
    next_hup = 1.0
    for i in range(n):
        due = start + i / a.rate
        now = time.time()
        if due > now:
            time.sleep(due - now)  # pacing the open-loop sender
        elapsed = time.time() - start
        if a.scenario == "vm-kill" and not faulted and elapsed >= fault_at:
            apis[0][0].kill()
            faulted = True
        if a.scenario == "reload" and elapsed >= next_hup:
            gw.send_signal(signal.SIGHUP)
            next_hup += 1.0
        t = threading.Thread(target=one, args=(i,))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    failed = sum(v for k, v in results.items() if k != 200)
    print(f"scenario {a.scenario}: {n} GETs at {a.rate:g}/s over {a.seconds:g} s")
    print("answers: " + ", ".join(f"{k}: {v}" for k, v in sorted(results.items(), key=str)))
    print(f"failed: {failed}")
    if a.scenario == "reload":
        print(f"reloads logged: {sum('configuration reloaded' in l for l in log)}; gateway alive: {gw.poll() is None}")
    gw.terminate()
    gw.wait(timeout=30)
    for p, _ in apis:
        p.kill()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
