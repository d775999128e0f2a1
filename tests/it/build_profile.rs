//! The optimization profile reaches the builds it is for, and only those:
//! `.cargo/config.toml` runs rustc through `benches/pgo/rustc-wrapper`, run
//! here as cargo runs it, in front of a stand-in rustc that writes down the
//! arguments it was given.
//!
//! - An optimized build (opt-level 3) with the profile's LLVM gets
//!   `-Cprofile-use` with the profile, and LLVM's warnings about functions
//!   changed since it was made are off unless `FENCEGATE_PGO=warn`.
//! - An unoptimized build, `FENCEGATE_PGO=off`, another LLVM, and builds that
//!   instrument code themselves (a profile being made, coverage, a fuzzer)
//!   get their arguments as they were.
//! - The profile is there, and the toolchain running these tests is the one
//!   that made it: a release build here is the one that ships.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The LLVM major version `toolchain.txt` says made the profile.
fn profile_llvm() -> String {
    let text = std::fs::read_to_string(repo("benches/pgo/toolchain.txt")).expect("benches/pgo/toolchain.txt");
    text.lines().find_map(|l| l.strip_prefix("llvm ")).expect("an `llvm <major>` line").trim().to_string()
}

/// A stand-in rustc in its own directory that answers `-vV` as a rustc of
/// LLVM `llvm` would and otherwise writes its arguments, one a line, to
/// `args` beside it.
fn fake_rustc(llvm: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let rustc = dir.path().join("rustc");
    let args = dir.path().join("args");
    std::fs::write(
        &rustc,
        format!(
            "#!/bin/sh\nif [ \"$1\" = -vV ]; then echo 'rustc 1.0.0'; echo 'LLVM version: {llvm}.1.2'; exit 0; fi\n\
             printf '%s\\n' \"$@\" > '{}'\n",
            args.display()
        ),
    )
    .unwrap();
    let mut mode = std::fs::metadata(&rustc).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut mode, 0o755);
    std::fs::set_permissions(&rustc, mode).unwrap();
    (dir, rustc)
}

/// What the stand-in rustc of LLVM `llvm` was given when the wrapper ran
/// it with `args`, with `pgo` as FENCEGATE_PGO.
fn through_wrapper(llvm: &str, pgo: Option<&str>, args: &[&str]) -> Vec<String> {
    let (dir, rustc) = fake_rustc(llvm);
    let mut wrapper = Command::new(repo("benches/pgo/rustc-wrapper"));
    wrapper.arg(&rustc).args(args).env_remove("FENCEGATE_PGO");
    if let Some(pgo) = pgo {
        wrapper.env("FENCEGATE_PGO", pgo);
    }
    let status = wrapper.status().expect("run benches/pgo/rustc-wrapper");
    assert!(status.success(), "the wrapper failed: {status:?}");
    let given = std::fs::read_to_string(dir.path().join("args")).expect("the stand-in rustc was run");
    given.lines().map(str::to_string).collect()
}

fn profile_use() -> String {
    format!("-Cprofile-use={}", repo("benches/pgo/fencegate.profdata").display())
}

const OPTIMIZED: &[&str] = &["--crate-name", "fencegate", "src/lib.rs", "-C", "opt-level=3", "-C", "lto=fat"];

#[test]
fn an_optimized_build_gets_the_profile() {
    let llvm = profile_llvm();
    let given = through_wrapper(&llvm, None, OPTIMIZED);
    let mut expected: Vec<String> = OPTIMIZED.iter().map(|a| a.to_string()).collect();
    expected.push(profile_use());
    // `warn`: LLVM names the functions changed since the profile was made.
    assert_eq!(through_wrapper(&llvm, Some("warn"), OPTIMIZED), expected);
    expected.push("-Cllvm-args=-no-pgo-warn-mismatch".into());
    assert_eq!(given, expected);
    // `on`, like anything but `off` and `warn`, is the default.
    assert_eq!(through_wrapper(&llvm, Some("on"), OPTIMIZED), expected);
}

#[test]
fn other_builds_get_their_arguments_unchanged() {
    let llvm = profile_llvm();
    let unchanged = |given: Vec<String>, args: &[&str]| {
        assert_eq!(given, args.iter().map(|a| a.to_string()).collect::<Vec<_>>(), "{args:?}");
    };
    let debug: &[&str] = &["--crate-name", "fencegate", "src/lib.rs", "-C", "debuginfo=2"];
    unchanged(through_wrapper(&llvm, None, debug), debug);
    unchanged(through_wrapper(&llvm, Some("off"), OPTIMIZED), OPTIMIZED);
    let other_llvm = (llvm.parse::<u32>().expect("a number") + 1).to_string();
    unchanged(through_wrapper(&other_llvm, None, OPTIMIZED), OPTIMIZED);
    for instrumenting in
        ["-Cprofile-generate=/tmp/raw", "-Cinstrument-coverage", "-Zsanitizer=address", "-Cpasses=sancov-module"]
    {
        let args: Vec<&str> = OPTIMIZED.iter().copied().chain([instrumenting]).collect();
        unchanged(through_wrapper(&llvm, None, &args), &args);
    }
}

#[test]
fn the_profile_is_there_for_this_toolchain() {
    assert!(repo("benches/pgo/fencegate.profdata").metadata().is_ok_and(|m| m.len() > 0));
    let config = std::fs::read_to_string(repo(".cargo/config.toml")).expect(".cargo/config.toml");
    assert!(config.lines().any(|l| l == r#"rustc-wrapper = "benches/pgo/rustc-wrapper""#));
    // The rustc cargo runs these tests with: its release builds are the
    // profile-guided ones, or the profile is stale for it.
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = Command::new(&rustc).arg("-vV").output().expect("rustc -vV");
    let version = String::from_utf8_lossy(&version.stdout);
    let major = version.lines().find_map(|l| l.strip_prefix("LLVM version: ")).and_then(|v| v.split('.').next());
    assert_eq!(
        major,
        Some(profile_llvm().as_str()),
        "this rustc's LLVM did not make benches/pgo/fencegate.profdata: make it again (benches/pgo/train.sh)"
    );
}
