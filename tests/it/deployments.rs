//! The shipped deployments have no side door, and the container image's config
//! serves where it runs: read from the files in the repository, no network.
//!
//! - The Kubernetes base (config/kubernetes/base): the legacy store in the pod
//!   listens on 127.0.0.1 only, fencegate's routes go to loopback, and a
//!   NetworkPolicy selects fencegate's pods and admits the Service's port only.
//!   Both overlays build on that base and keep it.
//! - The overlays' fencegate configs are valid fencegate configs.
//! - config/container.toml, the image's config, listens on 0.0.0.0 with both
//!   listeners, passes the real binary's `--check`, and leaves fence changes
//!   refused until an admin token is supplied (it names no token file that a
//!   plain `docker run` would lack).
//!
//! The manifests are read with a small reader for the YAML they use (block
//! mappings and sequences, flow sequences of quoted strings, `|` blocks), not
//! a YAML library: .ci/deploy-lint renders every kustomization and validates it
//! against the Kubernetes schema; this test pins the properties that matter.

use std::path::{Path, PathBuf};
use std::process::Command;

use fencegate::Config;
use serde_json::{json, Map, Value};

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

// ---------------------------------------------------------------- YAML subset

/// The documents of a YAML stream in the subset the manifests use.
fn yaml_documents(text: &str) -> Vec<Value> {
    let mut docs = Vec::new();
    let mut current: Vec<&str> = Vec::new();
    for line in text.lines().chain(std::iter::once("---")) {
        if line.trim_end() == "---" {
            let lines: Vec<Line> = significant(&current);
            if !lines.is_empty() {
                let mut at = 0;
                docs.push(node(&lines, &mut at, lines[0].indent));
            }
            current.clear();
        } else {
            current.push(line);
        }
    }
    docs
}

#[derive(Debug, Clone)]
struct Line {
    indent: usize,
    text: String,
    /// The raw lines of a `|` block that follows this line, indentation kept.
    block: Option<String>,
}

/// Lines without comments or blank lines; `|` blocks gathered onto their key.
fn significant(raw: &[&str]) -> Vec<Line> {
    let mut out: Vec<Line> = Vec::new();
    let mut i = 0;
    while i < raw.len() {
        let line = raw[i];
        i += 1;
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let indent = line.len() - trimmed.len();
        let text = strip_comment(trimmed).trim_end().to_string();
        let mut block = None;
        if text.ends_with(": |") || text == "|" {
            let mut lines = Vec::new();
            while i < raw.len() && (raw[i].trim().is_empty() || raw[i].len() - raw[i].trim_start().len() > indent) {
                lines.push(raw[i]);
                i += 1;
            }
            let cut = lines.iter().filter(|l| !l.trim().is_empty()).map(|l| l.len() - l.trim_start().len()).min();
            let cut = cut.unwrap_or(0);
            block = Some(lines.iter().map(|l| format!("{}\n", l.get(cut..).unwrap_or(""))).collect());
        }
        out.push(Line { indent, text, block });
    }
    out
}

/// A line without its trailing ` # comment`, unless the `#` is in quotes.
fn strip_comment(text: &str) -> &str {
    let mut quoted = None;
    let bytes = text.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        match (quoted, b) {
            (None, b'"' | b'\'') => quoted = Some(b),
            (Some(q), c) if c == q => quoted = None,
            (None, b'#') if i > 0 && bytes[i - 1] == b' ' => return &text[..i],
            _ => {}
        }
    }
    text
}

/// The node whose lines start at `lines[*at]`, all at `indent`.
fn node(lines: &[Line], at: &mut usize, indent: usize) -> Value {
    if lines[*at].text.starts_with("- ") || lines[*at].text == "-" {
        let mut items = Vec::new();
        while *at < lines.len() && lines[*at].indent == indent && lines[*at].text.starts_with('-') {
            // "- key: value" opens a mapping whose other keys sit two columns in.
            let rest = lines[*at].text[1..].trim_start().to_string();
            if rest.is_empty() {
                *at += 1;
                items.push(node(lines, at, lines[*at].indent));
                continue;
            }
            let mut first = lines[*at].clone();
            first.indent = indent + 2;
            first.text = rest;
            if !first.text.contains(": ") && !first.text.ends_with(':') {
                items.push(scalar(&first.text));
                *at += 1;
                continue;
            }
            let mut sub = vec![first];
            let mut j = *at + 1;
            while j < lines.len() && lines[j].indent > indent {
                sub.push(lines[j].clone());
                j += 1;
            }
            *at = j;
            let mut k = 0;
            items.push(node(&sub, &mut k, indent + 2));
        }
        return Value::Array(items);
    }
    let mut map = Map::new();
    while *at < lines.len() && lines[*at].indent == indent {
        let line = &lines[*at];
        let (key, value) = match line.text.split_once(':') {
            Some((k, v)) => (k.trim().trim_matches('"').to_string(), v.trim()),
            None => panic!("not a mapping line: {:?}", line.text),
        };
        *at += 1;
        let value = if value == "|" {
            Value::String(line.block.clone().unwrap_or_default())
        } else if !value.is_empty() {
            scalar(value)
        } else if *at < lines.len() && lines[*at].indent > indent {
            node(lines, at, lines[*at].indent)
        } else if *at < lines.len() && lines[*at].indent == indent && lines[*at].text.starts_with('-') {
            // A sequence may sit at its key's own indentation.
            node(lines, at, indent)
        } else {
            Value::Null
        };
        assert!(map.insert(key.clone(), value).is_none(), "repeated key {key}");
    }
    Value::Object(map)
}

fn scalar(text: &str) -> Value {
    if text.starts_with('[') || text.starts_with('{') {
        return serde_json::from_str(text).unwrap_or_else(|e| panic!("flow value {text}: {e}"));
    }
    if let Some(s) = text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
        return Value::String(s.to_string());
    }
    if let Ok(b) = text.parse::<bool>() {
        return Value::Bool(b);
    }
    match text.parse::<i64>() {
        Ok(n) if !text.starts_with('0') || text == "0" => json!(n),
        _ => Value::String(text.to_string()),
    }
}

/// The one document of `kind` named `name` in a manifest file.
fn manifest(path: &str, kind: &str, name: &str) -> Value {
    let docs = yaml_documents(&read(path));
    let found: Vec<_> = docs.into_iter().filter(|d| d["kind"] == kind && d["metadata"]["name"] == name).collect();
    assert_eq!(found.len(), 1, "{path}: one {kind} named {name}");
    found.into_iter().next().unwrap()
}

#[test]
fn the_yaml_reader_reads_the_shapes_the_manifests_use() {
    let docs = yaml_documents(
        "# c\na: 1\nt: true\nb:\n  - name: x   # note\n    port: proxy\n  - plain\nc: [\"p\", \"q\"]\nd: |\n  one\n    two\ne:\n- z\n---\nf: \"#1\"\n",
    );
    assert_eq!(docs.len(), 2);
    assert_eq!(
        docs[0],
        json!({"a": 1, "t": true, "b": [{"name": "x", "port": "proxy"}, "plain"], "c": ["p", "q"], "d": "one\n  two\n", "e": ["z"]})
    );
    assert_eq!(docs[1], json!({"f": "#1"}));
}

// ---------------------------------------------------------------- the base

const BASE: &str = "config/kubernetes/base";

fn base(file: &str) -> String {
    format!("{BASE}/{file}")
}

/// The pod's containers by name.
fn containers() -> Map<String, Value> {
    let set = manifest(&base("statefulset.yaml"), "StatefulSet", "fencegate");
    let list = set["spec"]["template"]["spec"]["containers"].as_array().expect("containers").clone();
    list.into_iter().map(|c| (c["name"].as_str().unwrap().to_string(), c)).collect()
}

/// The fencegate container's named ports.
fn fencegate_port(name: &str) -> i64 {
    let gate = &containers()["fencegate"];
    let port = gate["ports"].as_array().unwrap().iter().find(|p| p["name"] == name);
    port.and_then(|p| p["containerPort"].as_i64()).unwrap_or_else(|| panic!("no port {name}"))
}

/// The `listen` directives of the legacy store's nginx.conf.
fn store_listens() -> Vec<String> {
    let config = manifest(&base("legacy-store.yaml"), "ConfigMap", "legacy-store-config");
    let conf = config["data"]["nginx.conf"].as_str().expect("nginx.conf").to_string();
    conf.lines()
        .map(|l| l.split('#').next().unwrap().trim())
        .filter_map(|l| l.strip_prefix("listen "))
        .map(|l| l.trim_end_matches(';').trim().to_string())
        .collect()
}

#[test]
fn the_legacy_store_container_listens_on_loopback_only() {
    let listens = store_listens();
    assert!(!listens.is_empty(), "nginx.conf has no listen directive");
    for listen in &listens {
        let address = listen.split_whitespace().next().unwrap();
        assert!(address.starts_with("127.0.0.1:"), "the store listens on {listen}: reachable around fencegate");
    }
    // Its container runs that config, publishes no port, and takes no
    // arguments or environment that could change where it listens.
    let store = &containers()["legacy-store"];
    assert_eq!(store["command"], json!(["nginx", "-e", "stderr", "-c", "/etc/legacy-store/nginx.conf"]));
    for field in ["args", "env", "envFrom", "ports"] {
        assert!(store.get(field).is_none(), "the legacy-store container sets {field}");
    }
    let mounts = store["volumeMounts"].as_array().unwrap();
    assert!(mounts.iter().any(|m| m["name"] == "legacy-store-config" && m["mountPath"] == "/etc/legacy-store"));
    // The pod does not share the node's network, where loopback is the node's.
    let set = manifest(&base("statefulset.yaml"), "StatefulSet", "fencegate");
    assert!(set["spec"]["template"]["spec"].get("hostNetwork").is_none());
}

#[test]
fn the_base_network_policy_admits_the_service_port_only() {
    let kustomization = yaml_documents(&read(&base("kustomization.yaml"))).remove(0);
    assert!(kustomization["resources"].as_array().unwrap().contains(&json!("networkpolicy.yaml")));

    let policy = manifest(&base("networkpolicy.yaml"), "NetworkPolicy", "fencegate");
    let set = manifest(&base("statefulset.yaml"), "StatefulSet", "fencegate");
    let pod_labels = &set["spec"]["template"]["metadata"]["labels"];
    let selected = policy["spec"]["podSelector"]["matchLabels"].as_object().expect("matchLabels");
    assert!(!selected.is_empty(), "an empty podSelector selects every pod");
    for (k, v) in selected {
        assert_eq!(&pod_labels[k], v, "the policy does not select fencegate's pods");
    }
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress"]));

    // The Service's one port goes to the proxy port.
    let service = manifest(&base("service.yaml"), "Service", "fencegate");
    let service_ports = service["spec"]["ports"].as_array().unwrap();
    assert_eq!(service_ports.len(), 1, "the Service exposes one port");
    let target = &service_ports[0]["targetPort"];
    assert_eq!(target, "proxy");
    let proxy = fencegate_port("proxy");

    // Every rule names its ports (a rule without ports admits every port),
    // and every port is the Service's.
    let rules = policy["spec"]["ingress"].as_array().expect("ingress rules");
    assert!(!rules.is_empty());
    for rule in rules {
        let ports = rule["ports"].as_array().expect("a rule without ports admits every port");
        for port in ports {
            let number = match &port["port"] {
                Value::String(name) => fencegate_port(name),
                other => other.as_i64().expect("a port"),
            };
            assert_eq!(number, proxy, "the policy admits port {}: only the proxy's", port["port"]);
            assert!(port.get("endPort").is_none(), "a port range");
        }
    }
    assert_ne!(fencegate_port("admin"), proxy);
}

#[test]
fn both_overlays_keep_the_base_and_its_policy() {
    for overlay in ["demo", "shared-fences"] {
        let dir = format!("config/kubernetes/overlays/{overlay}");
        let kustomization = yaml_documents(&read(&format!("{dir}/kustomization.yaml"))).remove(0);
        let resources = kustomization["resources"].as_array().unwrap();
        assert!(resources.contains(&json!("../../base")), "{overlay} does not build on the base");
        // No patch of the overlay touches the NetworkPolicy or the store.
        for patch in kustomization["patches"].as_array().into_iter().flatten() {
            let path = patch["path"].as_str().expect("patches by file");
            let doc = yaml_documents(&read(&format!("{dir}/{path}"))).remove(0);
            assert_ne!(doc["kind"], "NetworkPolicy", "{overlay}/{path} patches the NetworkPolicy");
            let text = read(&format!("{dir}/{path}"));
            assert!(!text.contains("legacy-store"), "{overlay}/{path} patches the legacy store");
        }
        assert!(kustomization.get("patchesStrategicMerge").is_none() && kustomization.get("patchesJson6902").is_none());
    }
}

#[test]
fn the_overlays_configs_are_valid_and_route_to_loopback() {
    let store_ports: Vec<String> =
        store_listens().iter().map(|l| l.split_whitespace().next().unwrap().to_string()).collect();
    for (overlay, store) in [("demo", "file"), ("shared-fences", "redis")] {
        let path = format!("config/kubernetes/overlays/{overlay}/fencegate.toml");
        let text = read(&path);
        let config = Config::from_toml_str(&text).unwrap_or_else(|e| panic!("{path}:\n{e}"));
        assert!(config.server.tls.is_some(), "{path}: the Service's port serves TLS");
        assert!(!config.routes.is_empty());
        let raw: toml::Value = toml::from_str(&text).unwrap();
        assert_eq!(raw["fences"]["store"].as_str(), Some(store), "{path}");
        for route in raw["route"].as_array().unwrap() {
            let upstream = route["upstream"].as_str().unwrap();
            let authority = upstream.strip_prefix("http://").unwrap_or(upstream).split('/').next().unwrap();
            assert!(
                store_ports.iter().any(|s| s == authority),
                "{path}: route to {upstream}, not the store on loopback"
            );
        }
        // The listeners are the container's ports, on the pod's address.
        assert_eq!(config.server.listen.to_string(), format!("0.0.0.0:{}", fencegate_port("proxy")));
        assert_eq!(config.admin.listen.to_string(), format!("0.0.0.0:{}", fencegate_port("admin")));
        assert_eq!(raw["admin"]["auth_token_file"].as_str(), Some("/etc/fencegate/admin/token"), "{path}");
    }
}

// ---------------------------------------------------------------- the image's config

#[test]
fn the_container_config_listens_everywhere_and_passes_check() {
    let text = read("config/container.toml");
    let config = Config::from_toml_str(&text).unwrap_or_else(|e| panic!("config/container.toml:\n{e}"));
    assert_eq!(config.server.listen.to_string(), "0.0.0.0:8080");
    assert_eq!(config.admin.listen.to_string(), "0.0.0.0:9901");
    let dockerfile = read("Dockerfile");
    assert!(dockerfile.contains("COPY config/container.toml /etc/fencegate/fencegate.toml"));
    assert!(dockerfile.lines().any(|l| l == "EXPOSE 8080 9901"));

    // The real binary, as the image runs it: the check passes with no token
    // in the environment and no file beside it.
    let out = Command::new(env!("CARGO_BIN_EXE_fencegate"))
        .args(["--check", "--config"])
        .arg(repo("config/container.toml"))
        .env_remove("FENCEGATE_ADMIN_TOKEN")
        .env_remove("FENCEGATE_CONFIG")
        .current_dir(std::env::temp_dir())
        .output()
        .expect("run fencegate --check");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "fencegate --check config/container.toml: {:?}\n{stderr}", out.status);
}

#[test]
fn the_container_config_refuses_fence_changes_until_a_token_is_supplied() {
    let text = read("config/container.toml");
    // Nothing in the file opens the fence API: no inline token, and no token
    // file a plain `docker run` would lack (a missing one stops the start).
    assert!(fencegate::config::secret_files(&text).is_empty());
    let config = Config::from_toml_str(&text).unwrap().read_secrets_with(None).unwrap();
    assert_eq!(config.admin.auth_token, None, "fence changes must need a token the operator supplies");
    // The environment supplies one.
    let config = Config::from_toml_str(&text).unwrap().read_secrets_with(Some("t0k3n".into())).unwrap();
    assert_eq!(config.admin.auth_token.as_deref(), Some("t0k3n"));
}

#[test]
fn the_image_runs_as_a_non_root_user_and_carries_oci_labels() {
    let dockerfile = read("Dockerfile");
    // The last USER line is the one the container runs as.
    let user = dockerfile.lines().filter_map(|l| l.strip_prefix("USER ")).next_back().expect("a USER line");
    assert_eq!(user, "10001:10001", "the image must run as the non-root user the manifests expect");
    let set = manifest(&base("statefulset.yaml"), "StatefulSet", "fencegate");
    let security = &set["spec"]["template"]["spec"]["securityContext"];
    assert_eq!(security["runAsNonRoot"], json!(true));
    assert_eq!(security["runAsUser"], json!(10001));
    for label in ["title", "description", "version", "licenses", "source", "revision"] {
        assert!(dockerfile.contains(&format!("org.opencontainers.image.{label}=")), "no {label} label");
    }
    let version = format!("ARG VERSION={}", env!("CARGO_PKG_VERSION"));
    assert!(dockerfile.lines().any(|l| l == version), "the version label is Cargo.toml's version: {version}");
}
