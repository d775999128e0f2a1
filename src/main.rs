//! The `fencegate` command.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use fencegate::config::LogFormat;
use fencegate::{telemetry, Config, Fencegate};

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
    /// Log format; overrides `[log] format`.
    #[arg(long, value_enum)]
    log_format: Option<LogFormatArg>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormatArg {
    Human,
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let config = match Config::load(&cli.config) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    if cli.check {
        println!(
            "{}: OK ({} route{})",
            cli.config.display(),
            config.routes.len(),
            if config.routes.len() == 1 { "" } else { "s" }
        );
        return ExitCode::SUCCESS;
    }
    let format = match cli.log_format {
        Some(LogFormatArg::Json) => LogFormat::Json,
        Some(LogFormatArg::Human) => LogFormat::Human,
        None => config.log.format,
    };
    telemetry::init(format, &config.log.level);

    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let shutdown = match shutdown_signal() {
            Ok(shutdown) => shutdown,
            Err(e) => {
                tracing::error!("cannot install signal handlers: {e}");
                return ExitCode::FAILURE;
            }
        };
        let server = match Fencegate::bind(config).await {
            Ok(server) => server,
            Err(e) => {
                tracing::error!("{e}");
                return ExitCode::FAILURE;
            }
        };
        server.run(shutdown).await;
        ExitCode::SUCCESS
    })
}

/// Registers the SIGTERM and SIGINT handlers now (so a signal that arrives
/// while starting up is a graceful stop too) and resolves on the first of them.
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
    })
}
