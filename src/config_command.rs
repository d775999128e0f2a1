//! `fencegate --check` and `fencegate --print`: what the binary does with a
//! config when asked to look at it rather than run it.
//!
//! Not a module of the library: the `fencegate` binary declares it.

use std::path::Path;
use std::process::ExitCode;

use fencegate::Config;

/// Checks what the server would check at start beyond validation (the TLS
/// files load; an https upstream has roots to verify with), then prints
/// `OK`, or with `print` the configuration in force as TOML. A problem
/// exits 2, as a config that does not validate.
pub(crate) fn check_or_print(path: &Path, config: &Config, print: bool) -> ExitCode {
    // The TLS files are read as at start: a certificate that does not
    // load fails the check.
    if let Some(files) = &config.server.tls {
        if let Err(e) = fencegate::ServerTls::load(files) {
            eprintln!("{}: {e}", path.display());
            return ExitCode::from(2);
        }
    }
    for route in &config.routes {
        if let Some(why) = route.upstream_tls.as_ref().and_then(|t| t.no_roots()) {
            eprintln!(
                "{}: warning: route '{}': {why}; its https upstream cannot be verified until ca_file is set \
                 or the system's CA certificates are installed",
                path.display(),
                route.name
            );
        }
    }
    if print {
        // A comment, so the output stays a config file.
        let text = format!(
            "# The configuration in force from {}: every field, defaults filled in, secrets redacted.\n{}",
            path.display(),
            config.effective_toml()
        );
        return crate::print_bytes(text.as_bytes(), "the configuration");
    }
    let ok = format!(
        "{}: OK ({} route{})\n",
        path.display(),
        config.routes.len(),
        if config.routes.len() == 1 { "" } else { "s" }
    );
    crate::print_bytes(ok.as_bytes(), "the check's answer")
}
