//! The floors of `src/` (docs/architecture.md): each top-level module uses
//! only modules on floors below it, so the modules form no import cycle, and
//! no source file holds more than 600 lines. Read from the source, as a
//! newcomer would check it: every `crate::` path of a module's files outside
//! their `#[cfg(test)]` parts (unit tests may reach anywhere) is an edge.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The floors, bottom first; modules on one floor may not use each other.
const FLOORS: &[&[&str]] = &[
    &["http"],
    &["canonical"],
    &["config"],
    &["telemetry"],
    &["fence"],
    &["metrics"],
    &["proxy"],
    &["route"],
    &["admin"],
    &["stack"],
    &["server"],
];

/// The binary's own modules (declared by `main.rs`, beside the floors):
/// the library may not use them.
const BINARY_ONLY: &[&str] = &["allocator"];

const LONGEST_FILE: usize = 600;

fn floor_of(module: &str) -> Option<usize> {
    FLOORS.iter().position(|floor| floor.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file of `src/` belongs to (`None`: lib.rs, main.rs).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let first = file.strip_prefix(src).unwrap().components().next()?.as_os_str().to_str()?.to_owned();
    let name = first.strip_suffix(".rs").unwrap_or(&first).to_owned();
    (name != "lib" && name != "main").then_some(name)
}

/// The top-level modules `text` names through `crate::`, in paths and in
/// grouped imports (`use crate::{a::B, c}`).
fn used_modules(text: &str) -> BTreeSet<String> {
    let mut used = BTreeSet::new();
    let ident = |s: &str| s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect::<String>();
    for (i, _) in text.match_indices("crate::") {
        let before = text[..i].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &text[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find(';').unwrap_or(group.len())];
            // Each item of the group starts after `{` or `,` at depth one.
            let mut depth = 1;
            let mut start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 1 => {
                        start = true;
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 {
                    break;
                }
                if start && !c.is_whitespace() {
                    used.insert(ident(&group[j..]));
                    start = false;
                }
            }
        } else {
            used.insert(ident(rest));
        }
    }
    used
}

#[test]
fn every_module_uses_only_floors_below_it_and_no_file_runs_long() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();

    let mut edges: BTreeMap<String, BTreeMap<String, PathBuf>> = BTreeMap::new();
    let mut long = Vec::new();
    let mut modules = BTreeSet::new();
    for file in &files {
        let text = fs::read_to_string(file).unwrap();
        if text.lines().count() > LONGEST_FILE {
            long.push(format!("{} ({} lines)", file.display(), text.lines().count()));
        }
        let Some(module) = module_of(&src, file) else { continue };
        modules.insert(module.clone());
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        for used in used_modules(code) {
            if used != module && !used.is_empty() {
                edges.entry(module.clone()).or_default().entry(used).or_insert_with(|| file.clone());
            }
        }
    }

    let mut wrong = Vec::new();
    for module in &modules {
        if floor_of(module).is_none() && !BINARY_ONLY.contains(&module.as_str()) {
            wrong.push(format!("{module} is on no floor: add it to FLOORS and to docs/architecture.md"));
        }
    }
    for (module, used) in &edges {
        for (other, file) in used {
            if !modules.contains(other) {
                continue;
            }
            if BINARY_ONLY.contains(&other.as_str()) {
                wrong.push(format!("{module} uses {other}, which is the binary's own ({})", file.display()));
            }
            if let (Some(a), Some(b)) = (floor_of(module), floor_of(other)) {
                if b >= a {
                    wrong.push(format!("{module} uses {other}, on a floor not below it ({})", file.display()));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "modules out of their floors:\n{}", wrong.join("\n"));
    assert!(long.is_empty(), "files over {LONGEST_FILE} lines:\n{}", long.join("\n"));
}

#[test]
fn the_reader_finds_paths_and_grouped_imports() {
    let text = "use crate::config::Config;\nuse crate::{http::ProxyBody, fence::{gate, store}, metrics};\nlet _ = \
                crate::route::Route::detached; // not_crate::stack";
    let found: Vec<String> = used_modules(text).into_iter().collect();
    assert_eq!(found, ["config", "fence", "http", "metrics", "route"]);
}
