//! The floors of `src/` (docs/architecture.md): each top-level module uses
//! only modules on floors below it, so the modules form no import cycle, and
//! no source file holds more than 600 lines. Read from the source, as a
//! newcomer would check it: every path of a module's files that leaves the
//! module (`crate::x`, a `super::` that climbs to the crate's root, a name the
//! crate's root re-exports) is an edge, outside the items marked
//! `#[cfg(test)]` (unit tests may reach anywhere).

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
    &["demo"],
];

/// The binary's own modules (declared by `main.rs`, beside the floors):
/// the library may not use them.
const BINARY_ONLY: &[&str] = &["allocator", "config_command"];

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

/// How deep `file` sits below `src/` in the module tree: 1 for `src/x.rs`
/// and `src/x/mod.rs`, 2 for `src/x/a.rs`, ...: the number of `super::` that
/// climb from it to the crate's root.
fn depth_of(src: &Path, file: &Path) -> usize {
    let parts = file.strip_prefix(src).unwrap().components().count();
    if file.file_name().is_some_and(|n| n == "mod.rs") {
        parts - 1
    } else {
        parts
    }
}

/// `text` without the items marked `#[cfg(test)]`: the attribute and the
/// item after it, up to its `;` or its matching `}` (strings, character
/// literals and comments skipped while counting braces).
fn without_test_items(text: &str) -> String {
    const MARK: &str = "#[cfg(test)]";
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(MARK) {
        out.push_str(&rest[..at]);
        rest = &rest[at + MARK.len()..];
        rest = &rest[item_end(rest)..];
    }
    out.push_str(rest);
    out
}

/// Where the item that starts `text` ends: after its first `;` at depth
/// zero, or after the `}` that closes its first `{`.
fn item_end(text: &str) -> usize {
    let bytes = text.as_bytes();
    let mut depth = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                i += text[i..].find('\n').unwrap_or(text.len() - i);
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i += text[i..].find("*/").map_or(text.len() - i, |end| end + 2);
                continue;
            }
            b'r' if bytes.get(i + 1).is_some_and(|b| *b == b'#' || *b == b'"')
                && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_')) =>
            {
                // A raw string: r"..." or r#"..."#, as many `#` on both sides.
                let hashes = bytes[i + 1..].iter().take_while(|b| **b == b'#').count();
                let close = format!("\"{}", "#".repeat(hashes));
                let open = i + 1 + hashes + 1;
                i = open + text[open..].find(&close).map_or(text.len() - open, |end| end + close.len());
                continue;
            }
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
            }
            // A character literal ('{', '\'', '\\'), not a lifetime ('a).
            b'\'' if bytes.get(i + 2) == Some(&b'\'') => i += 2,
            b'\'' if bytes.get(i + 1) == Some(&b'\\') => {
                i += 2;
                while i < bytes.len() && bytes[i] != b'\'' {
                    i += 1;
                }
            }
            b'{' => depth += 1,
            b'}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            b';' if depth == 0 => return i + 1,
            _ => {}
        }
        i += 1;
    }
    text.len()
}

/// The names the crate's root re-exports (`pub use server::{Fencegate, ..};`
/// in lib.rs), each with the top-level module it comes from: `crate::Fencegate`
/// uses `server`.
fn root_reexports(lib: &str) -> BTreeMap<String, String> {
    let ident = |s: &str| s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect::<String>();
    let mut names = BTreeMap::new();
    for (at, _) in lib.match_indices("pub use ") {
        let statement = &lib[at + "pub use ".len()..];
        let statement = &statement[..statement.find(';').unwrap_or(statement.len())];
        let module = ident(statement.trim_start_matches("crate::"));
        // Each item is a path (its last name is exported) or `path as name`.
        for item in statement.split(['{', '}', ',']) {
            let item = item.trim();
            let name = match item.split_once(" as ") {
                Some((_, alias)) => alias.trim(),
                None => item.rsplit("::").next().unwrap_or_default().trim(),
            };
            if !name.is_empty() && name != "self" && !item.ends_with("::") {
                names.insert(name.to_string(), module.clone());
            }
        }
    }
    names
}

/// The top-level modules `text` names through `crate::` (in paths and in
/// grouped imports, `use crate::{a::B, c}`) and through `super::` paths that
/// climb `depth` levels or more, to the crate's root.
fn used_modules(text: &str, depth: usize) -> BTreeSet<String> {
    let mut used = BTreeSet::new();
    let ident = |s: &str| s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect::<String>();
    let starts_path = |i: usize| {
        let before = text[..i].chars().next_back();
        !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    };
    for (i, _) in text.match_indices("super::") {
        if !starts_path(i) {
            continue;
        }
        let mut rest = &text[i..];
        let mut climbs = 0;
        while let Some(after) = rest.strip_prefix("super::") {
            climbs += 1;
            rest = after;
        }
        if climbs >= depth {
            used.insert(ident(rest));
        }
    }
    for (i, _) in text.match_indices("crate::") {
        if !starts_path(i) {
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

    let reexports = root_reexports(&fs::read_to_string(src.join("lib.rs")).unwrap());
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
        let code = without_test_items(&text);
        for used in used_modules(&code, depth_of(&src, file)) {
            let used = reexports.get(&used).cloned().unwrap_or(used);
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
    let found: Vec<String> = used_modules(text, 1).into_iter().collect();
    assert_eq!(found, ["config", "fence", "http", "metrics", "route"]);
    // `super::` reaches the root from a module's own file, not from deeper.
    let text = "use super::stack::Routed;\nuse super::super::server::X;";
    assert_eq!(used_modules(text, 1).into_iter().collect::<Vec<_>>(), ["server", "stack"]);
    assert_eq!(used_modules(text, 2).into_iter().collect::<Vec<_>>(), ["server"]);
    assert!(used_modules(text, 3).is_empty());
}

#[test]
fn only_items_marked_for_tests_are_left_out() {
    let text = "use crate::a::X;\n#[cfg(test)]\nuse crate::b::Y;\nuse crate::c::Z;\n#[cfg(test)]\nmod tests {\n    \
                const S: &str = \"}{\"; const R: &str = r#\"}\"#; const C: char = '}';\n    // }\n    use crate::d;\n}\nfn \
                f<'a>(_: &'a str) { crate::e::go() }";
    let kept = without_test_items(text);
    assert_eq!(used_modules(&kept, 1).into_iter().collect::<Vec<_>>(), ["a", "c", "e"]);
}

#[test]
fn root_reexports_name_their_module() {
    let lib = "pub use config::Config;\npub use server::{\n    run, Fencegate,\n    Other as Renamed,\n};";
    let names = root_reexports(lib);
    assert_eq!(names.get("Config").map(String::as_str), Some("config"));
    assert_eq!(names.get("Fencegate").map(String::as_str), Some("server"));
    assert_eq!(names.get("run").map(String::as_str), Some("server"));
    assert_eq!(names.get("Renamed").map(String::as_str), Some("server"));
    assert!(!names.contains_key("Other"));
}
