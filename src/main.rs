//! The `fencegate` command.

// The global allocator, shared with the benchmarks and the hyper floor so
// they measure what ships.
mod allocator;
// `--check` and `--print`.
mod config_command;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use fencegate::config::LogFormat;
use fencegate::{telemetry, Config, Fencegate};

/// Many small allocations per request on several threads: see Cargo.toml.
#[global_allocator]
static ALLOCATOR: allocator::Mimalloc = allocator::Mimalloc;

/// mimalloc keeps freed memory until the thread that freed it allocates
/// again; a worker whose connections all rest does not. This returns what
/// the calling thread freed (once its purge delay has passed) to the system.
fn give_back_memory() {
    // SAFETY: mi_collect takes no pointers and may be called on any thread
    // at any time. Only the forced collection purges freed pages at once
    // (the unforced one returned nothing measurable); fencegate calls it at
    // most once per 200 ms per worker, and only after connections rest: a
    // small share of a core even with thousands of idle connections
    // (docs/perf-log.md, "Code comments' figures").
    unsafe { libmimalloc_sys::mi_collect(true) }
}

/// An HTTP reverse proxy that refuses stale fencing tokens.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// Config file (TOML).
    #[arg(long, env = "FENCEGATE_CONFIG", default_value = "config/fencegate.toml")]
    config: PathBuf,
    /// Validate the config, print every problem with its field, and exit.
    #[arg(long)]
    check: bool,
    /// Print the configuration in force (every field, defaults filled in,
    /// secrets redacted) as TOML, and exit; a config that does not validate
    /// fails as with --check.
    #[arg(long)]
    print: bool,
    /// Log format; overrides `[log] format`.
    #[arg(long, value_enum)]
    log_format: Option<LogFormatArg>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show the fence on its own, with nothing but the binary.
    ///
    /// fencegate starts in front of a small in-process store with no fencing
    /// of its own, plays a lock holder's late write being refused, then serves
    /// your own curl commands until Ctrl-C. Needs no config file.
    Demo {
        /// fencegate's proxy listener (port 0: any free port).
        #[arg(long, default_value = fencegate::demo::LISTEN)]
        listen: std::net::SocketAddr,
        /// fencegate's admin listener (its bearer token, demo-secret, is no
        /// secret: keep it on loopback).
        #[arg(long, default_value = fencegate::demo::ADMIN_LISTEN)]
        admin_listen: std::net::SocketAddr,
        /// The demo store's listener.
        #[arg(long, default_value = fencegate::demo::STORE_LISTEN)]
        store_listen: std::net::SocketAddr,
    },
    /// Read, raise or delete fences through the admin API of a running fencegate.
    ///
    /// With --admin-url, nothing is read from a config: the token comes from
    /// --token-file or FENCEGATE_ADMIN_TOKEN (reads need none). Without it, the
    /// admin address and token come from the config (`fencegate --config FILE
    /// fence ...`), whose other secret files (signing keys, TLS files) are not read.
    Fence {
        #[command(flatten)]
        admin: AdminArgs,
        #[command(subcommand)]
        action: FenceAction,
    },
    /// Take, renew, release or show a lease through the admin API of a
    /// running fencegate: the token a lease gets is above every token issued
    /// or seen for KEY, and the fence is raised to it before it is printed.
    ///
    /// The admin URL and bearer token come as for `fence` (--token-file may
    /// hold a token of [[admin.lease_tokens]]). Exit 1: the lease is held by
    /// another, or not held with the token given; exit 2: any other error.
    Lease {
        #[command(flatten)]
        admin: AdminArgs,
        #[command(subcommand)]
        action: LeaseAction,
    },
    /// Print the X-Fencing-Signature value for TOKEN on fence KEY: base64url
    /// (no padding) of HMAC-SHA256 over KEY, a newline, and TOKEN in base 10.
    ///
    /// KEY is the fence key fencegate makes for the request (the route's `key`
    /// template; the request path by default). The key file is read as a route's
    /// `signing_key_file` is: trailing whitespace removed, at least 16 bytes.
    /// Needs no config and no running fencegate.
    Sign {
        /// The fence key, e.g. "/objects/report.csv".
        key: String,
        /// The fencing token.
        token: u64,
        /// The shared secret (the same file as the route's `signing_key_file`).
        #[arg(long, value_name = "FILE")]
        key_file: PathBuf,
    },
    /// Print a completion script for SHELL to stdout.
    ///
    /// For example `fencegate completions bash > /etc/bash_completion.d/fencegate`,
    /// or `fencegate completions zsh > "${fpath[1]}/_fencegate"`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the fencegate(1) man page (roff) to stdout, or write a page for
    /// every subcommand into a directory.
    ///
    /// For example `fencegate man | man -l -`, or `fencegate man --dir /usr/local/share/man/man1`.
    Man {
        /// Write fencegate.1, fencegate-fence.1, fencegate-fence-get.1, ... into DIR.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

/// Where the admin API is and how to authenticate to it: for `fence`.
#[derive(Debug, clap::Args)]
struct AdminArgs {
    /// The admin listener, e.g. http://127.0.0.1:9901 (plain HTTP; a bare
    /// HOST:PORT works too). When given, no config is read.
    #[arg(long, env = "FENCEGATE_ADMIN_URL", value_name = "URL", global = true)]
    admin_url: Option<String>,
    /// A file holding the admin token ([admin] auth_token); surrounding
    /// whitespace is ignored. Takes precedence over FENCEGATE_ADMIN_TOKEN and
    /// the config.
    #[arg(long, env = "FENCEGATE_ADMIN_TOKEN_FILE", value_name = "FILE", global = true)]
    token_file: Option<PathBuf>,
    /// How long to wait for each answer of the admin API.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = humantime::parse_duration, global = true)]
    timeout: std::time::Duration,
}

#[derive(Debug, Subcommand)]
enum FenceAction {
    /// Print the fence (highest accepted token) of KEY, or "none".
    Get {
        /// The fence key, e.g. "/objects/report.csv".
        key: String,
    },
    /// Raise the fence of KEY to TOKEN (refused, exit 1, if it is already higher).
    Set {
        /// The fence key, e.g. "/objects/report.csv".
        key: String,
        /// The new fence: the token of the lock's new owner.
        token: u64,
    },
    /// Print "TOKEN<TAB>KEY" for every fence whose key starts with PREFIX.
    List {
        #[arg(default_value = "")]
        prefix: String,
    },
    /// Delete the fence of one key, or of every key under a prefix, so the key
    /// accepts any token again. Only for keys known to be dead: every holder of
    /// the key, a stale one included, can write again.
    Delete {
        /// Delete the fence of exactly this key.
        #[arg(long, conflicts_with = "prefix", required_unless_present = "prefix")]
        key: Option<String>,
        /// Delete every fence whose key starts with this.
        #[arg(long)]
        prefix: Option<String>,
        /// Needed with a prefix of "" or "/", which matches every key.
        #[arg(long, requires = "prefix")]
        all: bool,
    },
    /// Trust the shared (Redis) fence store again after fencegate stopped
    /// trusting it (it lost its identity or answered a mark below one seen):
    /// this replica raises every mark it remembers back into the store, then
    /// marks the store confirmed, and the other replicas follow. Run it once
    /// you know the store holds what it should (restored from a backup, or
    /// its loss judged acceptable).
    ConfirmStore,
}

#[derive(Debug, Subcommand)]
enum LeaseAction {
    /// Take the lease of KEY and print its token alone (for X-Fencing-Token).
    Acquire {
        /// The fence key, e.g. "/objects/report.csv".
        key: String,
        /// Who takes it: shown to whoever finds the lease held.
        #[arg(long, env = "FENCEGATE_LEASE_HOLDER")]
        holder: String,
        /// How long the lease lasts unless renewed (100ms to 1h).
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        ttl: std::time::Duration,
        /// How long to wait for a lease another holds (at most 60s).
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        wait: Option<std::time::Duration>,
        /// For a key written through a `strict` route: the fence is raised to
        /// one below the token, so the holder's first write is above it.
        #[arg(long)]
        strict: bool,
    },
    /// Lengthen the lease of KEY held with TOKEN to TTL from now.
    Renew {
        key: String,
        token: u64,
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        ttl: std::time::Duration,
    },
    /// End the lease of KEY held with TOKEN (the fence stays).
    Release { key: String, token: u64 },
    /// Print "HOLDER<TAB>TOKEN<TAB>MS_LEFT" of the lease held on KEY, or "none".
    Show { key: String },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormatArg {
    Human,
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        // These need no valid config, and `fence` reads at most its admin part.
        Some(Command::Demo { listen, admin_listen, store_listen }) => {
            return fencegate::demo::run(fencegate::demo::DemoOptions { listen, admin_listen, store_listen })
        }
        Some(Command::Sign { key, token, key_file }) => return sign(&key, token, &key_file),
        Some(Command::Fence { admin, action }) => {
            return admin_command(&cli.config, &admin, |client| fence_command(client, action))
        }
        Some(Command::Lease { admin, action }) => {
            return admin_command(&cli.config, &admin, |client| lease_command(client, action))
        }
        Some(Command::Completions { shell }) => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "fencegate", &mut script);
            return print_bytes(&script, "the completion script");
        }
        Some(Command::Man { dir }) => return man(dir.as_deref()),
        None => {}
    }
    let config = match Config::load(&cli.config) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    if cli.check || cli.print {
        return config_command::check_or_print(&cli.config, &config, cli.print);
    }
    let format = match cli.log_format {
        Some(LogFormatArg::Json) => LogFormat::Json,
        Some(LogFormatArg::Human) => LogFormat::Human,
        None => config.log.format,
    };
    // Held to the end of main: dropping it writes out the queued lines.
    let _log = telemetry::init(format, &config.log.level, &config.tracing);

    fencegate::give_back_memory_with(give_back_memory);

    // Accepting, the admin listener and signals: client connections are served
    // on worker threads of their own (`[server] workers`).
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let shutdown = match fencegate::shutdown_signal() {
            Ok(shutdown) => shutdown,
            Err(e) => {
                tracing::error!("cannot install signal handlers: {e}");
                return ExitCode::FAILURE;
            }
        };
        // SIGHUP reloads once fencegate runs; until then (opening the store
        // may take a while) it must not end the process, its default.
        let starting = ignore_hangup();
        let server = match Fencegate::bind(config).await {
            Ok(server) => server.reload_from(&cli.config),
            Err(e) => {
                tracing::error!("{e}");
                return ExitCode::FAILURE;
            }
        };
        drop(starting);
        server.run(shutdown).await;
        ExitCode::SUCCESS
    })
}

/// `fencegate sign`: needs only the key file, not a valid config.
fn sign(key: &str, token: u64, key_file: &std::path::Path) -> ExitCode {
    match fencegate::config::load_signing_key(key_file).map(|secret| secret.bytes().map(<[u8]>::to_vec)) {
        Ok(Some(secret)) => {
            let signature = fencegate::fence::signature::sign(&secret, key, token);
            print_bytes(format!("{signature}\n").as_bytes(), "the signature")
        }
        Ok(None) => {
            eprintln!("--key-file: the key could not be read");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("--key-file: {e}");
            ExitCode::from(2)
        }
    }
}

/// `fencegate man`: the top page to stdout, or every page into `dir`.
fn man(dir: Option<&std::path::Path>) -> ExitCode {
    let Some(dir) = dir else {
        let mut page = Vec::new();
        return match clap_mangen::Man::new(Cli::command()).render(&mut page) {
            Ok(()) => print_bytes(&page, "the man page"),
            Err(e) => {
                eprintln!("cannot render the man page: {e}");
                ExitCode::FAILURE
            }
        };
    };
    match clap_mangen::generate_to(Cli::command(), dir) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cannot write the man pages into '{}': {e}", dir.display());
            ExitCode::FAILURE
        }
    }
}

/// Writes `bytes` to stdout; a reader that went away early (`| head`) is
/// no error, any other failure (a full disk) is reported, never a panic.
fn print_bytes(bytes: &[u8], what: &str) -> ExitCode {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cannot write {what} to stdout: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The admin URL and token `fence` uses: `--admin-url` and the token from
/// `--token-file` or `FENCEGATE_ADMIN_TOKEN`, reading no config; else the
/// config's `[admin] listen` and its token, reading no other secret.
fn admin_target(
    config: &std::path::Path,
    args: &AdminArgs,
) -> Result<(fencegate::admin::client::AdminUrl, Option<String>), String> {
    use fencegate::admin::client::AdminUrl;
    use fencegate::config::{load_admin_token, ADMIN_TOKEN_ENV};
    let token_file = match &args.token_file {
        Some(path) => Some(load_admin_token(path).map_err(|e| format!("--token-file: {e}"))?),
        None => None,
    };
    match &args.admin_url {
        Some(url) => {
            let url = AdminUrl::parse(url).map_err(|e| format!("--admin-url: {e}"))?;
            let env = std::env::var(ADMIN_TOKEN_ENV).ok().filter(|t| !t.trim().is_empty());
            Ok((url, token_file.or(env.map(|t| t.trim().to_string()))))
        }
        None => {
            let hint = |e: fencegate::config::ConfigError| {
                format!("{e}\n(fencegate fence reads the admin address and token from the config; give --admin-url to read none)")
            };
            let validated = Config::load_validated(config).map_err(hint)?;
            let token = match token_file {
                Some(token) => Some(token),
                None => validated.read_admin_token().map_err(hint)?,
            };
            Ok((AdminUrl::from_listen(validated.admin.listen), token))
        }
    }
}

/// A line to stdout; a failed write (a full disk, a closed pipe) ends the
/// command with an error instead of println!'s panic.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write;
        writeln!(std::io::stdout().lock(), $($arg)*).map_err(fencegate::admin::client::CliError::Output)?
    }};
}

/// Runs a command of the admin API (`fence`, `lease`) with its client:
/// exit 2 on any error it meets.
fn admin_command<F, Fut>(config: &std::path::Path, args: &AdminArgs, run: F) -> ExitCode
where
    F: FnOnce(fencegate::admin::client::AdminClient) -> Fut,
    Fut: std::future::Future<Output = Result<ExitCode, fencegate::admin::client::CliError>>,
{
    use fencegate::admin::client::{AdminClient, CliError};
    let (url, token) = match admin_target(config, args) {
        Ok(target) => target,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(AdminClient::new(url, token, args.timeout))) {
        Ok(code) => code,
        // The reader went away (`fence list | head`): nothing left to say.
        Err(CliError::Output(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(2)
        }
    }
}

/// `fencegate fence ...`.
async fn fence_command(
    client: fencegate::admin::client::AdminClient,
    action: FenceAction,
) -> Result<ExitCode, fencegate::admin::client::CliError> {
    use fencegate::admin::client::SetOutcome;
    match action {
        FenceAction::Get { key } => {
            let token = client.get(&key).await?;
            say!("{}", token.map_or_else(|| "none".to_string(), |t| t.to_string()));
            Ok(ExitCode::SUCCESS)
        }
        FenceAction::Set { key, token } => match client.set(&key, token).await? {
            SetOutcome::Raised { previous } => {
                let was = previous.map_or_else(|| "none".to_string(), |p| p.to_string());
                say!("{key}: fence raised to {token} (was {was})");
                Ok(ExitCode::SUCCESS)
            }
            SetOutcome::Refused { current } => {
                eprintln!("{key}: refused, the fence is already {current}, above {token}; a fence never goes back");
                Ok(ExitCode::FAILURE)
            }
        },
        FenceAction::List { prefix } => {
            client
                .list(&prefix, |key, token| {
                    say!("{token}\t{key}");
                    Ok(())
                })
                .await?;
            Ok(ExitCode::SUCCESS)
        }
        FenceAction::Delete { key: Some(key), .. } => {
            let (deleted, token) = client.delete_key(&key).await?;
            match token {
                Some(token) if deleted > 0 => say!("{key}: fence {token} deleted"),
                _ => say!("{key}: had no fence"),
            };
            Ok(ExitCode::SUCCESS)
        }
        FenceAction::ConfirmStore => {
            let done = client.confirm_store().await?;
            say!(
                "fence store confirmed: identity {}, {} mark(s) this replica remembered restored; fenced writes \
                 held for {} ms while writes admitted before the loss may still reach the upstream",
                done["identity"].as_str().unwrap_or("?"),
                done["restored"].as_u64().unwrap_or(0),
                done["held_ms"].as_u64().unwrap_or(0)
            );
            Ok(ExitCode::SUCCESS)
        }
        FenceAction::Delete { key: None, prefix, all } => {
            let prefix = prefix.unwrap_or_default();
            let deleted = client.delete_prefix(&prefix, all).await?;
            say!("{prefix}: {deleted} fence{} deleted", if deleted == 1 { "" } else { "s" });
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `fencegate lease ...`: exit 1 when the lease is held by another or not
/// held with the token given.
async fn lease_command(
    client: fencegate::admin::client::AdminClient,
    action: LeaseAction,
) -> Result<ExitCode, fencegate::admin::client::CliError> {
    let refused = |key: &str, problem: serde_json::Value| {
        eprintln!("{key}: {}", problem["detail"].as_str().unwrap_or("refused"));
        Ok(ExitCode::FAILURE)
    };
    match action {
        LeaseAction::Acquire { key, holder, ttl, wait, strict } => {
            match client.lease_acquire(&key, &holder, (ttl, wait), strict).await? {
                Ok(lease) => {
                    say!("{}", lease["token"]);
                    Ok(ExitCode::SUCCESS)
                }
                Err(problem) => refused(&key, problem),
            }
        }
        LeaseAction::Renew { key, token, ttl } => match client.lease_renew(&key, token, ttl).await? {
            Ok(lease) => {
                say!("{key}: lease {token} renewed, {} ms left", lease["expires_in_ms"]);
                Ok(ExitCode::SUCCESS)
            }
            Err(problem) => refused(&key, problem),
        },
        LeaseAction::Release { key, token } => match client.lease_release(&key, token).await? {
            Ok(_) => {
                say!("{key}: lease {token} released");
                Ok(ExitCode::SUCCESS)
            }
            Err(problem) => refused(&key, problem),
        },
        LeaseAction::Show { key } => {
            let (lease, _) = client.lease_show(&key).await?;
            match lease["holder"].as_str() {
                Some(holder) => say!("{holder}\t{}\t{}", lease["token"], lease["expires_in_ms"]),
                None => say!("none"),
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Takes SIGHUP from its default action (ending the process) while held; the
/// signals that arrive meanwhile are dropped.
#[cfg(unix)]
fn ignore_hangup() -> Option<tokio::signal::unix::Signal> {
    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok()
}

#[cfg(not(unix))]
fn ignore_hangup() {}
