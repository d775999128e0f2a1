//! docs/configuration.md against the config structs, so the page cannot
//! drift from the code:
//!
//! - each section's fields, as the parser itself lists them (a field it does
//!   not know makes serde name every field it does), are exactly the fields
//!   of that section's table on the page;
//! - every `toml` block on the page validates as a config (one minimal route
//!   added to a block without routes), and the blocks set every field;
//! - a default written as one TOML value gives the same config as leaving
//!   the field out;
//! - a removed field is refused, with a message naming what replaces it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use fencegate::Config;

const MINIMAL_ROUTE: &str =
    "[[route]]\nname = \"objects\"\nprefix = \"/objects/\"\nupstream = \"http://127.0.0.1:9000\"\n";
const REDIS: &str = "[fences]\nstore = \"redis\"\nurl = \"redis://127.0.0.1:6379/0\"\n";

fn read(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// One row of a field table on the page.
#[derive(Debug)]
struct Row {
    section: String,
    field: String,
    /// The default column, or for a removed field what to do instead.
    second: String,
    removed: bool,
}

/// The page's field tables: a `## `[section]`` heading (`[[route]]` is
/// `route`), then rows whose first cell is a backticked field name.
fn rows(doc: &str) -> Vec<Row> {
    let mut rows = Vec::new();
    let mut section = None;
    let mut removed = false;
    let mut in_code = false;
    for line in doc.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        if let Some(heading) = line.strip_prefix("## ") {
            section = heading
                .strip_prefix('`')
                .and_then(|h| h.strip_suffix('`'))
                .map(|h| h.trim_matches(|c| c == '[' || c == ']').to_string());
            continue;
        }
        let Some(section) = &section else { continue };
        if line.starts_with("| field |") || line.starts_with("| removed field |") {
            removed = line.starts_with("| removed");
            continue;
        }
        let cells: Vec<&str> = line.split(" | ").map(|c| c.trim_matches(|c| c == '|' || c == ' ')).collect();
        let Some(field) = cells.first().and_then(|c| c.strip_prefix('`')).and_then(|c| c.strip_suffix('`')) else {
            continue;
        };
        assert!(cells.len() >= 3 || removed, "a row without a default or a meaning: {line}");
        rows.push(Row {
            section: section.clone(),
            field: field.to_string(),
            second: cells.get(1).copied().unwrap_or_default().to_string(),
            removed,
        });
    }
    rows
}

/// The page's `toml` blocks.
fn toml_blocks(doc: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in doc.lines() {
        match (&mut current, line.trim_start()) {
            (None, "```toml") => current = Some(String::new()),
            (Some(block), "```") => {
                blocks.push(std::mem::take(block));
                current = None;
            }
            (Some(block), _) => {
                block.push_str(line.trim_start());
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

/// The fields the config structs accept in `section` ("" for the top level),
/// as the parser lists them when it meets one it does not know.
fn fields_of(section: &str) -> BTreeSet<String> {
    let text = match section {
        "" => "zz_not_a_field = 1\n".to_string(),
        "route" => "[[route]]\nzz_not_a_field = 1\n".to_string(),
        section => format!("[{section}]\nzz_not_a_field = 1\n"),
    };
    let err = Config::from_toml_str(&text).expect_err("an unknown field is refused").to_string();
    let (_, expected) = err.split_once("expected").unwrap_or_else(|| panic!("no field list in: {err}"));
    let expected = expected.lines().next().unwrap_or_default();
    let names: BTreeSet<String> = expected.split('`').skip(1).step_by(2).map(str::to_string).collect();
    assert!(!names.is_empty(), "no field list in: {err}");
    names
}

/// Every key each block sets, by section (`server.tls`, `route`).
fn example_keys(blocks: &[String]) -> BTreeMap<String, BTreeSet<String>> {
    fn walk(prefix: &str, table: &toml::Table, out: &mut BTreeMap<String, BTreeSet<String>>) {
        for (key, value) in table {
            out.entry(prefix.to_string()).or_default().insert(key.clone());
            let inner = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
            match value {
                toml::Value::Table(t) => walk(&inner, t, out),
                toml::Value::Array(items) => {
                    for item in items {
                        if let toml::Value::Table(t) = item {
                            walk(&inner, t, out);
                        }
                    }
                }
                _ => {}
            }
        }
    }
    let mut out = BTreeMap::new();
    for block in blocks {
        let table: toml::Table = block.parse().unwrap_or_else(|e| panic!("a toml block does not parse:\n{block}\n{e}"));
        walk("", &table, &mut out);
    }
    out
}

/// A whole config: the block, with a minimal route when it has none.
fn whole(block: &str) -> String {
    if block.contains("[[route]]") {
        block.to_string()
    } else {
        format!("{block}\n{MINIMAL_ROUTE}")
    }
}

/// `base` with `field = value` set in `section` (a route's in the first route).
fn with_field(base: &str, section: &str, field: &str, value: toml::Value) -> String {
    let mut table: toml::Table = base.parse().unwrap();
    let mut target = &mut table;
    for part in section.split('.') {
        let entry = target.entry(part.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        target = match entry {
            toml::Value::Table(t) => t,
            toml::Value::Array(routes) => match routes.first_mut() {
                Some(toml::Value::Table(t)) => t,
                _ => panic!("{section} in {base}"),
            },
            _ => panic!("{section} in {base}"),
        };
    }
    target.insert(field.to_string(), value);
    toml::to_string(&table).unwrap()
}

/// The validated config `text` makes, as its Debug text; `None` if it does not validate.
fn config_of(text: &str) -> Option<String> {
    Config::from_toml_str(text).ok().map(|validated| format!("{:?}", &*validated))
}

#[test]
fn every_field_of_the_config_structs_is_on_the_page_and_no_other() {
    let doc = read("docs/configuration.md");
    let rows = rows(&doc);
    let mut documented: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for row in &rows {
        let new = documented.entry(row.section.clone()).or_default().insert(row.field.clone());
        assert!(new, "[{}] {} is documented twice", row.section, row.field);
    }
    let sections = fields_of("");
    for section in &sections {
        assert!(documented.contains_key(section), "the config has a [{section}] section the page does not document");
    }
    let mut wrong = Vec::new();
    for (section, fields) in &documented {
        // A nested section is a field of its parent: `server.tls` of `server`.
        match section.rsplit_once('.') {
            Some((parent, child)) => {
                assert!(fields_of(parent).contains(child), "the page documents [{section}], which the config has not")
            }
            None => assert!(sections.contains(section), "the page documents [{section}], which the config has not"),
        }
        let accepted = fields_of(section);
        for field in accepted.difference(fields) {
            wrong.push(format!("[{section}] {field}: accepted by the config, missing from docs/configuration.md"));
        }
        for field in fields.difference(&accepted) {
            wrong.push(format!("[{section}] {field}: on docs/configuration.md, unknown to the config"));
        }
    }
    assert!(wrong.is_empty(), "docs/configuration.md has drifted:\n{}", wrong.join("\n"));
}

#[test]
fn the_pages_examples_validate_and_set_every_field() {
    let doc = read("docs/configuration.md");
    let blocks = toml_blocks(&doc);
    assert!(blocks.len() >= 6, "the page's examples: {blocks:?}");
    for block in &blocks {
        if let Err(e) = Config::from_toml_str(&whole(block)) {
            panic!("an example on docs/configuration.md does not validate:\n{block}\n{e}");
        }
    }
    let set = example_keys(&blocks);
    let missing: Vec<String> = rows(&doc)
        .iter()
        .filter(|row| !row.removed)
        .filter(|row| !set.get(&row.section).is_some_and(|keys| keys.contains(&row.field)))
        .map(|row| format!("[{}] {}", row.section, row.field))
        .collect();
    assert!(missing.is_empty(), "fields no example on docs/configuration.md sets: {missing:?}");
}

#[test]
fn the_defaults_written_as_values_are_the_defaults() {
    let doc = read("docs/configuration.md");
    let bases = [MINIMAL_ROUTE.to_string(), format!("{REDIS}{MINIMAL_ROUTE}")];
    let mut checked = 0;
    let mut wrong = Vec::new();
    for row in rows(&doc).iter().filter(|row| !row.removed) {
        // One backticked TOML value, nothing else: a default to check.
        let Some(inner) = row.second.strip_prefix('`').and_then(|d| d.strip_suffix('`')) else { continue };
        if inner.contains('`') {
            continue;
        }
        let Ok(mut parsed) = format!("v = {inner}").parse::<toml::Table>() else { continue };
        let value = parsed.remove("v").unwrap();
        // The default must hold on a base where setting the field validates
        // (Redis fields need the Redis store, file fields the file store).
        let mut held = false;
        let mut tried = false;
        for base in &bases {
            let Some(set) = config_of(&with_field(base, &row.section, &row.field, value.clone())) else { continue };
            tried = true;
            held |= config_of(base).as_ref() == Some(&set);
        }
        checked += 1;
        if !tried {
            wrong.push(format!("[{}] {} = {inner}: does not validate", row.section, row.field));
        } else if !held {
            wrong.push(format!("[{}] {} = {inner}: not the default", row.section, row.field));
        }
    }
    assert!(checked >= 40, "only {checked} defaults checked: has the table's layout changed?");
    assert!(wrong.is_empty(), "defaults on docs/configuration.md that are wrong:\n{}", wrong.join("\n"));
}

#[test]
fn removed_fields_are_refused_naming_what_replaces_them() {
    let doc = read("docs/configuration.md");
    for row in rows(&doc).iter().filter(|row| row.removed) {
        let text = with_field(MINIMAL_ROUTE, &row.section, &row.field, toml::Value::Array(Vec::new()));
        let err = Config::from_toml_str(&text).expect_err("a removed field is refused").to_string();
        let named: Vec<&str> = row.second.split('`').skip(1).step_by(2).filter(|n| *n != row.field).collect();
        for name in named {
            assert!(err.contains(name), "refusing {} does not name {name}: {err}", row.field);
        }
    }
}

#[test]
fn the_commented_reference_config_names_every_field() {
    let reference = read("config/fencegate.toml");
    let mentioned = |field: &str| {
        reference.lines().any(|l| {
            let l = l.trim_start_matches('#').trim_start();
            l.starts_with(&format!("{field} ="))
                || l.starts_with(&format!("[{field}]"))
                || l.contains(&format!(".{field}]"))
        })
    };
    let doc = read("docs/configuration.md");
    let missing: Vec<String> = rows(&doc)
        .iter()
        .filter(|row| !row.removed && !mentioned(&row.field))
        .map(|row| format!("[{}] {}", row.section, row.field))
        .collect();
    assert!(missing.is_empty(), "fields config/fencegate.toml does not show: {missing:?}");
}
