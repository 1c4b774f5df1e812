#!/usr/bin/env python3
"""Validate deploy/kubernetes/ offline.

    python3 scripts/check-kubernetes.py [--binary PATH]

1. Every built-in kind against the Kubernetes API schemas of kubernetes-validate
   (PyPI), strict (unknown fields are errors), for each version in K8S_VERSIONS.
2. The ServiceMonitor against the vendored CRD schema
   (deploy/kubernetes/schemas/, scripts/vendor-servicemonitor-schema.py), made strict the
   same way. A kind with neither schema is an error, not a warning.
3. The references between the manifests: selectors match the pod labels, the
   StatefulSet's serviceName is a headless Service, named ports, ConfigMap and Secret
   names and keys, the ServiceMonitor's Service, port and bearerTokenSecret; more than
   one gateway replica needs `coordination: {type: redis}` and the Redis it names here.
4. The ConfigMap's spillway.yaml passes `spillway check` with the built binary (default
   $CARGO_TARGET_DIR/debug/spillway), in the container's environment, and listens on the
   container ports. A binary without the `aws` feature still validates every field; only
   its "needs AWS support" lines for the provider types are then accepted.

Exit 0 when everything holds; 1 with one line per problem otherwise.
"""

import argparse
import copy
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import jsonschema
import kubernetes_validate.utils as kv
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
DIR = ROOT / "deploy" / "kubernetes"
SCHEMAS = {("monitoring.coreos.com/v1", "ServiceMonitor"):
           DIR / "schemas" / "servicemonitor-monitoring.coreos.com-v1.json"}
# The oldest Kubernetes these manifests support (PodDisruptionBudget
# unhealthyPodEvictionPolicy is GA from 1.31) and the newest kubernetes-validate knows.
K8S_VERSIONS = ["1.31.0", kv.latest_version()]

problems = []


def problem(where, msg):
    problems.append(f"{where}: {msg}")


def strict(schema):
    """Forbid unknown fields wherever the schema lists properties (like --strict)."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def load():
    docs = []
    for path in sorted(DIR.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs.append((path.relative_to(ROOT), doc))
    return docs


def validate_schemas(docs):
    for path, doc in docs:
        key = (doc.get("apiVersion"), doc.get("kind"))
        where = f"{path} {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        if key in SCHEMAS:
            schema = strict(json.loads(SCHEMAS[key].read_text()))
            errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(doc),
                            key=lambda e: list(e.path))
            for e in errors:
                problem(where, f"{'.'.join(map(str, e.path)) or '<root>'}: {e.message}")
            if not errors:
                print(f"ok  {where} (vendored CRD schema)")
            continue
        for version in K8S_VERSIONS:
            try:
                got = kv.validate(copy.deepcopy(doc), version, strict=True)
                print(f"ok  {where} (Kubernetes {got}, strict)")
            except kv.ValidationError as e:
                problem(where, f"Kubernetes {e.version}: {'.'.join(map(str, e.path))}: {e.message}")
            except kv.SchemaNotFoundError:
                problem(where, f"no schema for {key[0]} {key[1]} (Kubernetes {version})")


def matches(selector, labels):
    return all(labels.get(k) == v for k, v in (selector or {}).items())


def check_references(docs):
    by_kind = {}
    for path, doc in docs:
        by_kind.setdefault(doc["kind"], []).append(doc)
    sts_list = by_kind.get("StatefulSet", [])
    if len(sts_list) != 1:
        problem("deploy/kubernetes", f"expected one StatefulSet, found {len(sts_list)}")
        return None
    sts = sts_list[0]
    spec = sts["spec"]
    where = f"StatefulSet/{sts['metadata']['name']}"
    replicas = spec.get("replicas", 1)
    if not isinstance(replicas, int) or replicas < 1:
        problem(where, f"replicas must be at least 1, got {replicas!r}")
    pod = spec["template"]
    labels = pod["metadata"]["labels"]
    if not matches(spec["selector"]["matchLabels"], labels):
        problem(where, "selector does not match the pod template's labels")
    container = pod["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    # Readiness is /readyz (503 while the gateway cannot serve), liveness /livez (the
    # process works): a liveness probe on readiness would restart a gateway that only
    # waits for its VMs.
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/livez")):
        get = container.get(probe, {}).get("httpGet")
        if not get:
            problem(where, f"no {probe} httpGet")
        elif get["port"] not in ports or get["path"] != path or ports[get["port"]] != ports.get("admin"):
            problem(where, f"{probe} must get {path} on the admin port")
    # The coordination store's own Deployment and Service (redis.yaml) are checked
    # apart: every other Service must select the gateway's pods.
    redis_pods = [d for d in by_kind.get("Deployment", []) + by_kind.get("StatefulSet", [])[1:]
                  if any("redis" in c.get("image", "")
                         for c in d["spec"]["template"]["spec"]["containers"])]
    redis_labels = [d["spec"]["template"]["metadata"]["labels"] for d in redis_pods]
    all_services = {s["metadata"]["name"]: s for s in by_kind.get("Service", [])}
    redis_services = {n: s for n, s in all_services.items()
                      if any(matches(s["spec"].get("selector"), l) for l in redis_labels)}
    services = {n: s for n, s in all_services.items() if n not in redis_services}
    headless = services.get(spec["serviceName"])
    if not headless or headless["spec"].get("clusterIP") != "None":
        problem(where, f"serviceName {spec['serviceName']} is not a headless Service here")
    for name, svc in services.items():
        if not matches(svc["spec"].get("selector"), labels):
            problem(f"Service/{name}", "selector does not match the StatefulSet's pods")
        for p in svc["spec"]["ports"]:
            if isinstance(p["targetPort"], str) and p["targetPort"] not in ports:
                problem(f"Service/{name}", f"targetPort {p['targetPort']} is no container port")
    for pdb in by_kind.get("PodDisruptionBudget", []):
        if not matches(pdb["spec"]["selector"]["matchLabels"], labels):
            problem(f"PodDisruptionBudget/{pdb['metadata']['name']}", "selector matches no pod")
    if not by_kind.get("PodDisruptionBudget"):
        problem("deploy/kubernetes", "no PodDisruptionBudget")
    if not any(t.get("metadata", {}).get("name") in
               {m["name"] for m in container.get("volumeMounts", [])
                if m["mountPath"] == "/var/lib/spillway"}
               for t in spec.get("volumeClaimTemplates", [])):
        problem(where, "no volumeClaimTemplate mounted at /var/lib/spillway (the store)")
    configmaps = {c["metadata"]["name"]: c for c in by_kind.get("ConfigMap", [])}
    secrets = {s["metadata"]["name"]: s for s in by_kind.get("Secret", [])}

    def secret_keys(name):
        s = secrets.get(name, {})
        return set(s.get("stringData", {})) | set(s.get("data", {}))

    mounts = {m["name"]: m for m in container.get("volumeMounts", [])}
    files = {}
    for vol in pod["spec"].get("volumes", []):
        mount = mounts.get(vol["name"])
        if not mount:
            problem(where, f"volume {vol['name']} is not mounted")
            continue
        if "configMap" in vol:
            cm = configmaps.get(vol["configMap"]["name"])
            if not cm:
                problem(where, f"ConfigMap {vol['configMap']['name']} is not in deploy/kubernetes")
            else:
                for key, text in cm.get("data", {}).items():
                    files[f"{mount['mountPath']}/{key}"] = ("configmap", text)
        if "secret" in vol:
            name = vol["secret"]["secretName"]
            for item in vol["secret"].get("items", []):
                if item["key"] not in secret_keys(name):
                    problem(where, f"Secret {name} has no key {item['key']}")
                files[f"{mount['mountPath']}/{item['path']}"] = ("secret", item["key"])
    for env in container.get("env", []):
        ref = env.get("valueFrom", {}).get("secretKeyRef")
        if ref and not ref.get("optional") and ref["key"] not in secret_keys(ref["name"]):
            problem(where, f"env {env['name']}: Secret {ref['name']} has no key {ref['key']}")
    for sm in by_kind.get("ServiceMonitor", []):
        w = f"ServiceMonitor/{sm['metadata']['name']}"
        targets = [s for s in services.values()
                   if matches(sm["spec"]["selector"]["matchLabels"], s["metadata"].get("labels", {}))]
        if len(targets) != 1:
            problem(w, f"selects {len(targets)} Services, not exactly one")
            continue
        for ep in sm["spec"]["endpoints"]:
            svc_ports = {p["name"]: p for p in targets[0]["spec"]["ports"]}
            if ep["port"] not in svc_ports:
                problem(w, f"port {ep['port']} is not a port of Service/{targets[0]['metadata']['name']}")
            elif svc_ports[ep["port"]]["targetPort"] != "admin":
                problem(w, "does not scrape the admin port")
            bts = ep.get("bearerTokenSecret")
            if not bts:
                problem(w, "no bearerTokenSecret (the admin token)")
            elif bts["key"] not in secret_keys(bts["name"]):
                problem(w, f"bearerTokenSecret: Secret {bts['name']} has no key {bts['key']}")
    return sts, container, ports, files, secret_keys, redis_services


def check_replicas(refs):
    """More than one gateway replica needs `coordination: {type: redis}` in the config
    (one fenced leader writes the pool) and a Redis here whose Service the URL names."""
    sts, container, ports, files, _, redis_services = refs
    replicas = sts["spec"].get("replicas", 1)
    if not isinstance(replicas, int) or replicas <= 1:
        return
    where = f"StatefulSet/{sts['metadata']['name']}"
    args = container.get("args", [])
    config_path = next((a for a in args if a.endswith(".yaml")), None)
    text = files.get(config_path, (None, ""))[1] if config_path else ""
    config = yaml.safe_load(text) if text else {}
    coord = (config or {}).get("coordination") or {}
    if coord.get("type") != "redis":
        problem(where, f"replicas: {replicas} needs coordination: {{type: redis}} in "
                       f"{config_path}: without it every replica writes the VM pool")
        return
    url = str(coord.get("url", ""))
    host = url.split("://", 1)[-1].split("/", 1)[0].rsplit("@", 1)[-1].split(":", 1)[0]
    if not redis_services:
        problem(where, f"replicas: {replicas} needs a Redis (Deployment + Service) in "
                       f"deploy/kubernetes for coordination.url {url}")
    elif host.split(".", 1)[0] not in redis_services:
        problem(where, f"coordination.url {url} names no Redis Service here "
                       f"({', '.join(sorted(redis_services))})")
    else:
        print(f"ok  {where}: {replicas} replicas coordinated through Service/{host.split('.', 1)[0]}")


def check_config(binary, refs):
    sts, container, ports, files, _, _ = refs
    args = container.get("args", [])
    config_path = next((a for a in args if a.endswith(".yaml")), None)
    if not config_path or files.get(config_path, (None,))[0] != "configmap":
        problem("StatefulSet", f"the config file {config_path} is not a mounted ConfigMap key")
        return
    text = files[config_path][1]
    features = ""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
        features = next((line.split(":", 1)[1].strip() for line in out.splitlines()
                         if line.startswith("features:")), "")
    except (OSError, subprocess.CalledProcessError) as e:
        problem(binary, f"cannot run --version: {e}")
        return
    config = yaml.safe_load(text)
    for field, port_name in (("listen", "http"), ("admin_listen", "admin")):
        addr = config.get("gateway", {}).get(field, "")
        if not addr.endswith(f":{ports.get(port_name)}"):
            problem("ConfigMap", f"gateway.{field} {addr} is not on the container port {port_name} ({ports.get(port_name)})")
        if not addr.startswith("0.0.0.0:") and not addr.startswith("[::]:"):
            problem("ConfigMap", f"gateway.{field} {addr} is not reachable from outside the pod")
    has_aws = "aws" in features.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ)
        for e in container.get("env", []):
            if "value" in e:
                env[e["name"]] = e["value"]
        # Files the pod reads (the admin token) are remapped into the temporary directory.
        for path, (kind, key) in files.items():
            local = pathlib.Path(tmp) / pathlib.Path(path).name
            local.write_text(key if kind == "configmap" else "ci-admin-token-0123456789abcdef")
            for name, value in list(env.items()):
                if value == path:
                    env[name] = str(local)
            # ... and so are the config's own references to them (admin_token_file).
            text = text.replace(path, str(local))
        cfg = pathlib.Path(tmp) / "spillway.yaml"
        cfg.write_text(text)
        run = subprocess.run([binary, "check", str(cfg)], capture_output=True, text=True, env=env)
        if run.returncode == 0:
            print(f"ok  ConfigMap spillway-config: spillway check (features: {features})")
            return
        # Without the `aws` feature, `check` still parses and validates every EC2 and
        # Lambda field and only adds "needs AWS support" for the provider types: anything
        # else is a real problem.
        lines = [line.strip() for line in (run.stdout + run.stderr).splitlines()[1:] if line.strip()]
        if not has_aws and lines and all("needs AWS support" in line for line in lines):
            print(f"ok  ConfigMap spillway-config: spillway check (features: {features or 'none'}; "
                  f"only the `aws` feature is missing, which the image needs)")
        else:
            start = next((i + 2 for i, line in enumerate((DIR / "configmap.yaml").read_text().splitlines())
                          if line.strip().startswith("spillway.yaml:")), "?")
            problem("ConfigMap spillway-config", f"spillway check failed (line 1 of spillway.yaml "
                    f"is line {start} of deploy/kubernetes/configmap.yaml):\n" + run.stdout + run.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    target = os.environ.get("CARGO_TARGET_DIR", str(ROOT / "target"))
    ap.add_argument("--binary", default=os.path.join(target, "debug", "spillway"))
    args = ap.parse_args()
    docs = load()
    validate_schemas(docs)
    refs = check_references(docs)
    if refs:
        check_replicas(refs)
        if os.access(args.binary, os.X_OK):
            check_config(args.binary, refs)
        else:
            problem(args.binary, "no spillway binary here (cargo build --locked, or --binary PATH)")
    for p in problems:
        print(f"ERROR {p}", file=sys.stderr)
    if problems:
        return 1
    print(f"kubernetes manifests ok: {len(docs)} objects")
    return 0


if __name__ == "__main__":
    sys.exit(main())
