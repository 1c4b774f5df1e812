#!/usr/bin/env python3
"""Gateway memory with many idle keep-alive client connections.

Starts `spillway serve` (static pool of one `spillway sample-api`), then:
  1. RSS baseline after one request,
  2. opens N client connections, sends one keep-alive GET on each, reads the answer and
     leaves the connection idle; RSS at N idle connections,
  3. closes them all, waits 30 s, RSS again.
Prints both figures (and the goal: <= 128 MiB at 10,000; back within 20 % of the
baseline 30 s after closing). Loopback only.

  loadtests/scenarios/idle_connections.py [--spillway PATH] [--connections N] [--settle S]
"""
import argparse, os, socket, subprocess, sys, tempfile, time


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_listening(proc, needle, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        if needle in line:
            return line
    raise RuntimeError(f"no {needle!r} from {proc.args}")


def get(sock):
    sock.sendall(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            raise RuntimeError("closed")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length"))
    while len(body) < length:
        body += sock.recv(4096)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spillway", default=os.environ.get("SPILLWAY", "target/release/spillway"))
    ap.add_argument("--connections", type=int, default=10_000)
    ap.add_argument("--settle", type=float, default=30.0)
    a = ap.parse_args()
    api_port = free_port()
    api = subprocess.Popen([a.spillway, "sample-api", "--listen", f"127.0.0.1:{api_port}", "--name", "vm"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory() as d:
        cfg = os.path.join(d, "g.yaml")
        with open(cfg, "w") as f:
            f.write(f"""gateway:
  listen: 127.0.0.1:0
  admin_listen: 127.0.0.1:0
  allow_loopback_upstreams: true
  # every connection comes from 127.0.0.1: lift the per-client-IP cap (a quarter of
  # max_connections by default) above the count this scenario opens
  max_connections: {a.connections + 100}
  max_connections_per_client_ip: {a.connections + 100}
libra: {{decision_epochs: 1000, r_max_rps: 100000, rho: 1.0}}
vm_pool: {{type: static, urls: ["http://127.0.0.1:{api_port}"]}}
function_tier:
  type: process
  command: ["{a.spillway}", "sample-api", "--listen", "127.0.0.1:{{port}}", "--name", "fn"]
  max_instances: 1
""")
        gw = subprocess.Popen([a.spillway, "serve", "--config", cfg], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, env={**os.environ, "RUST_LOG": "warn,spillway=info"})
        try:
            line = wait_listening(gw, "spillway listening")
            proxy = line.split("proxy=")[1].split()[0]
            host, port = proxy.rsplit(":", 1)
            time.sleep(1.0)
            s = socket.create_connection((host, int(port)))
            get(s)
            s.close()
            time.sleep(1.0)
            base = rss_kib(gw.pid)
            conns = []
            for _ in range(a.connections):
                c = socket.create_connection((host, int(port)))
                get(c)
                conns.append(c)
            time.sleep(1.0)
            loaded = rss_kib(gw.pid)
            for c in conns:
                c.close()
            conns.clear()
            time.sleep(a.settle)
            after = rss_kib(gw.pid)
            per = (loaded - base) / a.connections
            print(f"baseline RSS            {base / 1024:8.1f} MiB")
            print(f"{a.connections} idle connections {loaded / 1024:8.1f} MiB  ({per:.1f} KiB per connection; goal <= 128 MiB at 10,000)")
            print(f"{a.settle:.0f} s after closing     {after / 1024:8.1f} MiB  ({(after - base) / base * 100:+.0f} % of baseline; goal within 20 %)")
        finally:
            gw.terminate()
            gw.wait(timeout=30)
            api.terminate()
            api.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
