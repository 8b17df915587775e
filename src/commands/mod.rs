//! The edge between the CLI and the library: each subcommand's runner, logging setup, Ctrl-C
//! handling and the mapping of outcomes and errors to exit codes.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::cli::{Command, GlobalArgs};

pub mod demo;
pub mod down;
pub mod exec;
pub mod generate;
pub mod gpus;
pub mod instances;
pub mod jobs;
pub mod logs;
pub mod profile;
pub mod progress;
pub mod status;
pub mod sweep;
pub mod up;

/// Exit codes (README "Exit codes").
pub mod code {
    pub const OK: u8 = 0;
    pub const PARTIAL: u8 = 1;
    pub const USAGE: u8 = 2;
    pub const INTERRUPTED: u8 = 130;
}

/// How a command ended when it did not fail outright.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// Some hosts, instances or trials failed; the rest succeeded.
    Partial,
    Interrupted,
}

/// An error in what the user gave us (flags, profile, inventory): exit code 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// State every command shares: global flags and the cancellation signal fed by Ctrl-C.
#[derive(Clone)]
pub struct Ctx {
    pub global: Arc<GlobalArgs>,
    pub cancel: CancellationToken,
}

impl Ctx {
    pub fn new(global: GlobalArgs) -> Self {
        Ctx {
            global: Arc::new(global),
            cancel: CancellationToken::new(),
        }
    }

    /// First Ctrl-C cancels the token so commands wind down cleanly; a second one exits at once.
    pub fn watch_ctrl_c(&self) {
        let cancel = self.cancel.clone();
        // Detached on purpose: it lives exactly as long as the process.
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_err() {
                return;
            }
            tracing::warn!("interrupted: finishing up (Ctrl-C again to abort at once)");
            cancel.cancel();
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!("aborted");
                std::process::exit(code::INTERRUPTED as i32);
            }
        });
    }

    pub fn connect_options(&self) -> crate::remote::ConnectOptions {
        crate::remote::ConnectOptions {
            accept_new_host_key: self.global.accept_new_host_key,
            connect_timeout: self.global.connect_timeout,
        }
    }
}

pub fn init_logging(global: &GlobalArgs) {
    let level = if global.quiet {
        "warn"
    } else {
        match global.verbose {
            0 => "info",
            1 => "fleet=debug,info",
            _ => "debug",
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("FLEET_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .without_time()
        .init();
}

pub async fn dispatch(ctx: &Ctx, command: Command) -> anyhow::Result<Outcome> {
    match command {
        Command::Up(args) => up::run(ctx, &args).await,
        Command::Status(args) => status::run(ctx, &args).await,
        Command::Down(args) => down::run(ctx, &args).await,
        Command::Logs(args) => logs::run(ctx, &args).await,
        Command::Demo(args) => demo::run(ctx, &args).await,
        Command::Gpus => gpus::run(ctx).await,
        Command::Exec(args) => exec::run(ctx, &args).await,
        Command::Profile(cmd) => profile::run(ctx, &cmd),
        Command::Generate(args) => generate::run(ctx, &args).await,
        Command::Sweep(args) => sweep::run(ctx, &args).await,
        Command::Progress(args) => progress::run(ctx, &args).await,
        Command::Jobs => jobs::list(ctx).await,
        Command::Stop(args) => jobs::stop(ctx, &args).await,
        Command::Fetch(args) => jobs::fetch(ctx, &args).await,
        Command::Completions { shell } => {
            use clap::CommandFactory;
            let mut cmd = crate::cli::Cli::command();
            clap_complete::generate(shell, &mut cmd, "fleet", &mut std::io::stdout());
            Ok(Outcome::Ok)
        }
    }
}

/// Machine output on stdout.
pub fn print_json(v: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// Prints a failed command's error chain and picks its exit code.
pub fn exit_code(ctx: &Ctx, result: anyhow::Result<Outcome>) -> u8 {
    match result {
        Ok(Outcome::Ok) => code::OK,
        Ok(Outcome::Partial) => code::PARTIAL,
        Ok(Outcome::Interrupted) => code::INTERRUPTED,
        Err(e) => {
            eprintln!("error: {e:#}");
            if ctx.cancel.is_cancelled() {
                code::INTERRUPTED
            } else if is_usage(&e) {
                code::USAGE
            } else {
                code::PARTIAL
            }
        }
    }
}

fn is_usage(e: &anyhow::Error) -> bool {
    e.chain()
        .any(|c| c.is::<UsageError>() || c.is::<crate::config::ConfigError>())
}
