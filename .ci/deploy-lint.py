"""The checks .ci/deploy-lint runs on each rendered kustomization, past the schema.

Arguments: triples of (set name, kustomization directory, rendered YAML file).
Prints every problem found, prefixed with its set, and exits 1 if there is one.
"""

import re
import sys
import tomllib
from pathlib import Path, PurePosixPath

import yaml

problems = []
current = "setup"


def problem(msg):
    problems.append(f"{current}: {msg}")


class UniqueKeyLoader(yaml.SafeLoader):
    """A SafeLoader that refuses a key repeated in one mapping (the last would win)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"repeated key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_all(path):
    try:
        with open(path) as f:
            return [d for d in yaml.load_all(f, Loader=UniqueKeyLoader) if d]
    except yaml.YAMLError as e:
        problem(f"{path}: {e}")
        return []


def duration(text):
    """Seconds of a humantime duration such as "30s", "2m" or "1m 30s"."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    parts = re.findall(r"(\d+)\s*(ms|s|m|h)", text)
    if not parts or re.sub(r"[\d\s]|ms|s|m|h", "", text):
        problem(f"cannot read the duration {text!r}")
        return 0
    return sum(int(n) * units[u] for n, u in parts)


def pre_stop(container):
    """Seconds the container's preStop hook sleeps."""
    hook = container.get("lifecycle", {}).get("preStop", {})
    if "sleep" in hook:
        return hook["sleep"]["seconds"]
    command = hook.get("exec", {}).get("command", [])
    if len(command) == 2 and command[0].endswith("sleep"):
        return int(command[1])
    return 0


def under(path, directory):
    return PurePosixPath(directory) in PurePosixPath(path).parents


def loopback_host(authority):
    host = authority.rsplit("@", 1)[-1]
    host = host[1:].split("]")[0] if host.startswith("[") else host.split(":")[0]
    return host in ("127.0.0.1", "localhost", "::1")


def selects(selector, labels):
    """Whether a label selector picks these labels, and names at least one (an
    empty selector picks every pod)."""
    wanted = selector.get("matchLabels", {})
    return bool(wanted) and not selector.get("matchExpressions") and all(labels.get(k) == v for k, v in wanted.items())


# ---- the Dockerfile and the container config (once, not per set) ----------

with open("Dockerfile") as f:
    dockerfile = f.read()
with open("Cargo.toml", "rb") as f:
    package = tomllib.load(f)["package"]
user = re.search(r"^USER (\d+):(\d+)$", dockerfile, re.M)
if not user:
    problem("Dockerfile: no USER uid:gid")
# The image is built with the toolchain the optimization profile was made
# with (benches/pgo/toolchain.txt), which the rustc wrapper needs to apply it,
# and never with one older than the crate's rust-version.
image_rust = re.search(r"^ARG RUST_VERSION=(\S+)$", dockerfile, re.M)
profile_rust = re.search(r"^rustc (\S+)$", Path("benches/pgo/toolchain.txt").read_text(), re.M)
if not profile_rust:
    problem("benches/pgo/toolchain.txt: no 'rustc <version>' line")
elif not image_rust or image_rust[1] != profile_rust[1]:
    problem(f"Dockerfile: ARG RUST_VERSION must be the profile's toolchain, {profile_rust[1]} (benches/pgo/toolchain.txt)")
def version(text):
    return tuple(int(part) for part in text.split("."))
if image_rust and version(image_rust[1]) < version(package["rust-version"]):
    problem(f"Dockerfile: ARG RUST_VERSION is older than Cargo.toml's rust-version, {package['rust-version']}")
if "COPY .cargo ./.cargo" not in dockerfile or "COPY benches/pgo ./benches/pgo" not in dockerfile:
    problem("Dockerfile: the build must copy .cargo/ and benches/pgo/ (the rustc wrapper and the profile)")
image_version = re.search(r"^ARG VERSION=(\S+)$", dockerfile, re.M)
if not image_version or image_version[1] != package["version"]:
    problem(f"Dockerfile: ARG VERSION must be Cargo.toml's version, {package['version']}")
for label in ("title", "description", "version", "licenses", "source", "revision"):
    if f"org.opencontainers.image.{label}=" not in dockerfile:
        problem(f"Dockerfile: no org.opencontainers.image.{label} label")
if f'org.opencontainers.image.licenses="{package["license"]}"' not in dockerfile:
    problem(f"Dockerfile: the licenses label must be Cargo.toml's license, {package['license']}")
# The image serves where it runs: its config listens on every address, on the
# ports it exposes.
if "COPY config/container.toml /etc/fencegate/fencegate.toml" not in dockerfile:
    problem("Dockerfile: the image's config must be config/container.toml")
exposed = re.search(r"^EXPOSE ([\d ]+)$", dockerfile, re.M)
exposed = sorted(int(p) for p in exposed[1].split()) if exposed else []
with open("config/container.toml", "rb") as f:
    container = tomllib.load(f)
listens = [container.get(s, {}).get("listen", "") for s in ("server", "admin")]
for listen in listens:
    if not re.fullmatch(r"0\.0\.0\.0:\d+", listen):
        problem(f"config/container.toml: listen {listen!r} must be 0.0.0.0:PORT")
if sorted(int(l.rsplit(":", 1)[-1]) for l in listens if ":" in l) != exposed:
    problem(f"config/container.toml listens on {listens}; the Dockerfile exposes {exposed}")


# ---- each rendered set ------------------------------------------------------


def files_named(directory):
    """The files a kustomization directory's kustomization.yaml names."""
    with open(Path(directory) / "kustomization.yaml") as f:
        k = yaml.load(f, Loader=UniqueKeyLoader)
    named = set(k.get("resources", []))
    named |= {p["path"] for p in k.get("patches", []) if "path" in p}
    for generator in k.get("configMapGenerator", []) + k.get("secretGenerator", []):
        named |= {f.split("=", 1)[-1] for f in generator.get("files", [])}
    return named


def check_set(directory, rendered):
    # Every manifest or config file in the directory is part of the set.
    named = files_named(directory)
    for path in sorted(Path(directory).iterdir()):
        if path.suffix in (".yaml", ".yml", ".toml") and path.name != "kustomization.yaml" and path.name not in named:
            problem(f"{path} is not named in its kustomization.yaml")

    resources = load_all(rendered)

    def find(kind, name, required=True):
        for r in resources:
            if r.get("kind") == kind and r.get("metadata", {}).get("name") == name:
                return r
        if required:
            problem(f"no {kind} named {name}")
        return None

    statefulset = find("StatefulSet", "fencegate")
    service = find("Service", "fencegate")
    policy = find("NetworkPolicy", "fencegate")
    if not statefulset or not service:
        return
    spec = statefulset["spec"]
    pod = spec["template"]["spec"]
    pod_labels = spec["template"]["metadata"].get("labels", {})
    containers = {c["name"]: c for c in pod["containers"]}
    gate = containers["fencegate"]
    store = containers.get("legacy-store")
    ports = {p["name"]: p["containerPort"] for p in gate.get("ports", [])}

    def port_number(port):
        return ports.get(port, port) if isinstance(port, str) else port

    # The image's user is the pod's.
    security = pod.get("securityContext", {})
    if user:
        uid, gid = int(user[1]), int(user[2])
        for field, value in {"runAsUser": uid, "runAsGroup": gid, "fsGroup": gid}.items():
            if security.get(field) != value:
                problem(f"pod securityContext.{field} is {security.get(field)}, the image's is {value}")

    # No side door. The Service reaches the proxy port only.
    targets = {port_number(p.get("targetPort", p.get("port"))) for p in service["spec"].get("ports", [])}
    if targets != {ports.get("proxy")}:
        problem(f"the Service fencegate targets ports {sorted(map(str, targets))}; only proxy ({ports.get('proxy')})")
    # The NetworkPolicy selects fencegate's pods and admits the proxy port only.
    if policy:
        pspec = policy["spec"]
        if not selects(pspec.get("podSelector", {}), pod_labels):
            problem("the NetworkPolicy fencegate does not select fencegate's pods")
        if "Ingress" not in pspec.get("policyTypes", []):
            problem("the NetworkPolicy fencegate must list Ingress in policyTypes")
        rules = pspec.get("ingress", [])
        admitted = [port_number(p.get("port")) for rule in rules for p in rule.get("ports", [])]
        if not rules or any(not rule.get("ports") for rule in rules) or set(admitted) != {ports.get("proxy")}:
            problem(f"the NetworkPolicy fencegate must admit the proxy port ({ports.get('proxy')}) only; it admits {admitted or 'every port'}")
    # The legacy store listens on loopback only.
    if store:
        configmap = find("ConfigMap", "legacy-store-config")
        conf = (configmap or {}).get("data", {}).get("nginx.conf", "")
        listens = re.findall(r"^\s*listen\s+([^;]+);", conf, re.M)
        if not listens or any(not loopback_host(l.split()[0]) for l in listens):
            problem(f"the legacy store must listen on 127.0.0.1 only; nginx.conf listens on {listens}")
        if store.get("ports"):
            problem("the legacy-store container declares ports: it listens on loopback only")

    # The rest needs fencegate's config, which the overlays add.
    configmap = find("ConfigMap", "fencegate-config", required=directory.startswith("config/kubernetes/overlays/"))
    if not configmap:
        return
    data = configmap.get("data", {})
    if set(data) != {"fencegate.toml"} or configmap.get("binaryData"):
        problem(f"ConfigMap fencegate-config must hold one key, fencegate.toml; it holds {sorted(data)}")
    try:
        config = tomllib.loads(data.get("fencegate.toml", ""))
    except tomllib.TOMLDecodeError as e:
        problem(f"fencegate.toml is not valid TOML: {e}")
        return

    # Every route goes to the store in the pod, on loopback.
    for route in config.get("route", []):
        upstream = route.get("upstream", "")
        authority = re.sub(r"^[a-z]+://", "", upstream).split("/", 1)[0]
        if not loopback_host(authority):
            problem(f"route {route.get('name')!r}: upstream {upstream!r} is not on the pod's loopback interface")

    # Replicas against the fence store.
    fences = config.get("fences", {})
    kind = fences.get("store", "file")
    replicas = spec.get("replicas", 1)
    if kind != "redis" and replicas != 1:
        problem(f"{replicas} replicas with the {kind} store: only a shared (redis) store serves several")
    if kind == "redis":
        host = re.sub(r"^rediss?://", "", fences.get("url", "")).rsplit("@", 1)[-1].split(":")[0].split("/")[0]
        redis_service = find("Service", host)
        redis_policy = find("NetworkPolicy", host)
        if redis_service and redis_policy:
            rspec = redis_policy["spec"]
            if rspec.get("podSelector") != {"matchLabels": redis_service["spec"].get("selector")}:
                problem(f"the NetworkPolicy {host} does not select the Service {host}'s pods")
            sources = [f for rule in rspec.get("ingress", []) for f in rule.get("from", [None])]
            if not sources or any(not f or not selects(f.get("podSelector", {}), pod_labels)
                                  or f.get("namespaceSelector") or f.get("ipBlock") for f in sources):
                problem(f"the NetworkPolicy {host} must admit fencegate's pods only")
        redis_set = find("StatefulSet", host)
        if redis_set:
            conf_maps = [r for r in resources if r.get("kind") == "ConfigMap" and "redis.conf" in r.get("data", {})]
            conf = conf_maps[0]["data"]["redis.conf"] if conf_maps else ""
            for line in ("appendonly yes", "appendfsync always", "maxmemory-policy noeviction"):
                if not re.search(rf"^\s*{line}\s*$", conf, re.M):
                    problem(f"redis.conf must say {line!r}")

    # The shutdown arithmetic (base/statefulset.yaml explains it).
    grace = duration(config.get("server", {}).get("shutdown_grace", "30s"))
    drained = pre_stop(gate) + grace
    kill = pod.get("terminationGracePeriodSeconds", 30)
    if kill <= drained:
        problem(f"terminationGracePeriodSeconds ({kill}) must be above fencegate's preStop + shutdown_grace ({drained})")
    if store:
        if pre_stop(store) < drained:
            problem(f"the legacy store's preStop ({pre_stop(store)}s) must last until fencegate has drained ({drained}s)")
        if kill <= pre_stop(store):
            problem(f"terminationGracePeriodSeconds ({kill}) must be above the legacy store's preStop ({pre_stop(store)})")

    # The listeners are the container's named ports, on every address.
    for section, name in (("server", "proxy"), ("admin", "admin")):
        listen = config.get(section, {}).get("listen", "")
        if listen != f"0.0.0.0:{ports.get(name)}":
            problem(f"[{section}] listen is {listen!r}; the container's port {name} is 0.0.0.0:{ports.get(name)}")

    # Every file fencegate reads or writes is on a mounted volume, mounted
    # whole (a subPath mount never sees an update); the file store's on a claim.
    mounts = gate.get("volumeMounts", [])
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for m in mounts:
        if "subPath" in m or "subPathExpr" in m:
            problem(f"fencegate's volume {m['name']} is mounted with subPath: it would never be updated")
    env = {e["name"]: e.get("value") for e in gate.get("env", [])}
    files = {
        "FENCEGATE_CONFIG": env.get("FENCEGATE_CONFIG"),
        "[server.tls] cert": config.get("server", {}).get("tls", {}).get("cert"),
        "[server.tls] key": config.get("server", {}).get("tls", {}).get("key"),
        "[admin] auth_token_file": config.get("admin", {}).get("auth_token_file"),
    }
    if kind == "file":
        files["[fences] path"] = fences.get("path")
    for what, path in files.items():
        if not path:
            problem(f"{what} is not set")
            continue
        mount = next((m for m in mounts if under(path, m["mountPath"])), None)
        if not mount:
            problem(f"{what} ({path}) is on no volume mounted in the fencegate container")
        elif what == "[fences] path":
            claim = volumes.get(mount["name"], {}).get("persistentVolumeClaim", {}).get("claimName")
            if not claim or not find("PersistentVolumeClaim", claim):
                problem(f"the file store ({path}) must be on a PersistentVolumeClaim of the set")


args = sys.argv[1:]
for i in range(0, len(args), 3):
    current, directory, rendered = args[i:i + 3]
    check_set(directory, rendered)

for p in problems:
    print(f"deploy-lint: {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
