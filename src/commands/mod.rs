//! The edge between the CLI and the library: each subcommand's runner, logging setup, the
//! signals that interrupt a command (SIGINT, SIGTERM, SIGHUP) and the mapping of outcomes and
//! errors to exit codes.

use std::error::Error;
use std::fmt;
use std::sync::{Arc, OnceLock};

use tokio_util::sync::CancellationToken;

use crate::cli::{Command, GlobalArgs};

pub mod demo;
pub mod down;
pub mod entry;
pub mod exec;
pub mod generate;
pub mod gpus;
pub mod jobs;
pub mod logs;
pub mod nofile;
pub mod output;
pub mod profile;
pub mod progress;
pub mod report;
pub mod router;
pub mod status;
pub mod sweep;
pub mod up;

/// Exit codes (README "Exit codes").
pub mod code {
    pub const OK: u8 = 0;
    /// Some hosts, instances, trials or prompts failed; the others are reported.
    pub const PARTIAL: u8 = 1;
    pub const USAGE: u8 = 2;
    /// An error stopped the command (the only host unreachable, an I/O error).
    pub const FAILED: u8 = 3;
    /// A bug in fleet: a panic (`EX_SOFTWARE` of sysexits.h).
    pub const INTERNAL: u8 = 70;
    /// Interrupted by SIGINT (Ctrl-C); SIGTERM gives 143 and SIGHUP 129, 128 + the signal's
    /// number as shells report a process killed by it.
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

/// An error in what the user gave us (flags, profile, inventory): exit code 2. It wraps the
/// typed error it comes from, showing that error's message and passing on its source chain
/// (`{:#}` prints all of it), or a plain message.
#[derive(Debug)]
pub struct UsageError {
    source: Box<dyn Error + Send + Sync + 'static>,
}

impl UsageError {
    /// A typed error (or a message: `String`, `&str`) that is the user's to fix.
    pub fn new(error: impl Into<Box<dyn Error + Send + Sync + 'static>>) -> Self {
        UsageError {
            source: error.into(),
        }
    }

    /// The error this one wraps, e.g. to downcast to its type.
    pub fn inner(&self) -> &(dyn Error + Send + Sync + 'static) {
        self.source.as_ref()
    }
}

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.source, f)
    }
}

impl Error for UsageError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.source()
    }
}

/// The signal that interrupted a command: the first of SIGINT, SIGTERM and SIGHUP to arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interrupt {
    /// Ctrl-C.
    Int,
    /// systemd stopping a unit, `kill`.
    Term,
    /// A closed terminal, `tmux kill-session`.
    Hup,
}

impl Interrupt {
    pub fn name(self) -> &'static str {
        match self {
            Interrupt::Int => "SIGINT",
            Interrupt::Term => "SIGTERM",
            Interrupt::Hup => "SIGHUP",
        }
    }

    pub const ALL: [Interrupt; 3] = [Interrupt::Int, Interrupt::Term, Interrupt::Hup];

    /// The signal's number.
    pub fn signal(self) -> i32 {
        match self {
            Interrupt::Int => libc::SIGINT,
            Interrupt::Term => libc::SIGTERM,
            Interrupt::Hup => libc::SIGHUP,
        }
    }

    /// 128 + the signal's number, as a shell reports a process that signal killed.
    pub fn exit_code(self) -> u8 {
        128 + self.signal() as u8
    }

    /// Whether a fleet process that exited with `code` was interrupted.
    pub fn is_exit_code(code: i32) -> bool {
        Self::ALL.iter().any(|i| i32::from(i.exit_code()) == code)
    }
}

/// State every command shares: global flags and the cancellation signal fed by SIGINT, SIGTERM
/// and SIGHUP.
#[derive(Clone)]
pub struct Ctx {
    pub global: Arc<GlobalArgs>,
    pub cancel: CancellationToken,
    interrupt: Arc<OnceLock<Interrupt>>,
}

impl Ctx {
    pub fn new(global: GlobalArgs) -> Self {
        Ctx {
            global: Arc::new(global),
            cancel: CancellationToken::new(),
            interrupt: Arc::new(OnceLock::new()),
        }
    }

    /// The first SIGINT, SIGTERM or SIGHUP cancels the token so the command winds down as on
    /// Ctrl-C (`fleet up` stops what it started, generate writes everything); a second one of
    /// any of them exits at once.
    pub fn watch_signals(&self) {
        use tokio::signal::unix::{SignalKind, signal};
        let kinds = [
            (Interrupt::Int, SignalKind::interrupt()),
            (Interrupt::Term, SignalKind::terminate()),
            (Interrupt::Hup, SignalKind::hangup()),
        ];
        let mut streams = Vec::new();
        for (which, kind) in kinds {
            match signal(kind) {
                Ok(s) => streams.push((which, s)),
                Err(e) => tracing::warn!("cannot watch {}: {e}", which.name()),
            }
        }
        let (cancel, interrupt) = (self.cancel.clone(), self.interrupt.clone());
        // Detached on purpose: it lives exactly as long as the process.
        tokio::spawn(async move {
            let Some(first) = next_signal(&mut streams).await else {
                return;
            };
            let _ = interrupt.set(first);
            tracing::warn!(
                "interrupted ({}): finishing up (a second signal aborts at once)",
                first.name()
            );
            cancel.cancel();
            if next_signal(&mut streams).await.is_some() {
                output::eoutln!("aborted");
                std::process::exit(first.exit_code().into());
            }
        });
    }

    /// The signal that interrupted this command, if one did.
    pub fn interrupted_by(&self) -> Option<Interrupt> {
        self.interrupt.get().copied()
    }

    fn interrupted_code(&self) -> u8 {
        self.interrupted_by()
            .map_or(code::INTERRUPTED, Interrupt::exit_code)
    }

    /// The format results are printed in.
    pub fn format(&self) -> crate::render::Format {
        self.global.format()
    }

    pub fn connect_options(&self) -> crate::remote::ConnectOptions {
        crate::remote::ConnectOptions {
            accept_new_host_key: self.global.accept_new_host_key,
            connect_timeout: self.global.connect_timeout,
        }
    }
}

/// Whichever watched signal comes next; `None` when none can come any more.
async fn next_signal(
    streams: &mut [(Interrupt, tokio::signal::unix::Signal)],
) -> Option<Interrupt> {
    if streams.is_empty() {
        return None;
    }
    let waits = streams.iter_mut().map(|(which, s)| {
        let which = *which;
        Box::pin(async move { s.recv().await.map(|()| which) })
    });
    futures::future::select_all(waits).await.0
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
        .with_writer(output::LogWriter)
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
        Command::Report(args) => report::run(ctx, &args),
        Command::Jobs => jobs::list(ctx).await,
        Command::Stop(args) => jobs::stop(ctx, &args).await,
        Command::Fetch(args) => jobs::fetch(ctx, &args).await,
        Command::Completions { shell } => {
            use clap::CommandFactory;
            let mut cmd = crate::cli::Cli::command();
            // Into memory first: clap_complete panics when its writer fails (a closed pipe).
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut cmd, "fleet", &mut script);
            output::stdout(&script);
            Ok(Outcome::Ok)
        }
    }
}

/// A command's result on stdout, in the format `--format` (or `--json`) asked for.
pub fn emit(ctx: &Ctx, m: &impl crate::render::Model) -> anyhow::Result<()> {
    output::out!("{}", crate::render::render(m, ctx.format())?);
    Ok(())
}

/// Prints a failed command's error chain and picks its exit code (an interrupted command's is
/// the interrupting signal's).
pub fn exit_code(ctx: &Ctx, result: anyhow::Result<Outcome>) -> u8 {
    match result {
        Ok(Outcome::Ok) => code::OK,
        Ok(Outcome::Partial) => code::PARTIAL,
        Ok(Outcome::Interrupted) => ctx.interrupted_code(),
        Err(e) => {
            output::eoutln!("error: {}", describe(&e));
            if ctx.cancel.is_cancelled() {
                ctx.interrupted_code()
            } else if is_usage(&e) {
                code::USAGE
            } else if is_panic(&e) {
                code::INTERNAL
            } else {
                code::FAILED
            }
        }
    }
}

/// An error and its causes on one line, as `{:#}` writes them, less each cause that the message
/// before it already quotes: many messages name their source (`cannot read X: {source}`) so that
/// they read whole in a log line, and the chain would say it twice.
pub fn describe(e: &anyhow::Error) -> String {
    let mut text = String::new();
    let mut last = String::new();
    for cause in e.chain() {
        let said = cause.to_string();
        if !last.is_empty() && last.contains(&said) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&said);
        last = said;
    }
    text
}

/// A task that panicked, as the runtime reports it to whoever joins it: a bug, like a panic on
/// the main thread (which the panic hook of `main` turns into the same exit code).
fn is_panic(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<tokio::task::JoinError>()
            .is_some_and(tokio::task::JoinError::is_panic)
    })
}

/// What a panic says, for the panic hook: its message and where it happened.
pub fn internal_error(info: &std::panic::PanicHookInfo<'_>) -> String {
    let payload = info.payload();
    let message = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)");
    let at = info
        .location()
        .map_or(String::new(), |l| format!(" at {}:{}", l.file(), l.line()));
    format!("internal error: {message}{at}; please report it")
}

fn is_usage(e: &anyhow::Error) -> bool {
    e.chain()
        .any(|c| c.is::<UsageError>() || c.is::<crate::config::ConfigError>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("bad profile")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn a_usage_error_shows_the_wrapped_error_and_its_sources() {
        let e: anyhow::Error = UsageError::new(Outer(std::io::Error::other("disk on fire"))).into();
        assert_eq!(format!("{e:#}"), "bad profile: disk on fire");
        assert!(is_usage(&e));
        let usage = e.downcast_ref::<UsageError>().unwrap();
        assert!(usage.inner().is::<Outer>(), "the typed error is kept");
        let plain: anyhow::Error = UsageError::new("no such host".to_string()).into();
        assert_eq!(format!("{plain:#}"), "no such host");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read fleet.yaml: {0}")]
    struct Quoting(#[source] Outer);

    #[test]
    fn a_cause_the_message_already_quotes_is_not_said_twice() {
        let e: anyhow::Error = Quoting(Outer(std::io::Error::other("disk on fire"))).into();
        assert_eq!(
            describe(&e),
            "cannot read fleet.yaml: bad profile: disk on fire"
        );
        let e = anyhow::Error::new(Outer(std::io::Error::other("disk on fire"))).context("up");
        assert_eq!(describe(&e), "up: bad profile: disk on fire");
    }

    #[tokio::test]
    async fn a_panicked_task_is_an_internal_error_and_other_errors_fail_the_command() {
        let ctx = Ctx::new(<crate::cli::Cli as clap::Parser>::parse_from(["fleet", "jobs"]).global);
        let joined = tokio::spawn(async { panic!("boom") }).await.unwrap_err();
        let e = anyhow::Error::new(joined).context("generate");
        assert_eq!(exit_code(&ctx, Err(e)), code::INTERNAL);
        let io = anyhow::Error::new(std::io::Error::other("disk full"));
        assert_eq!(exit_code(&ctx, Err(io)), code::FAILED);
        let usage: anyhow::Error = UsageError::new("bad flag").into();
        assert_eq!(exit_code(&ctx, Err(usage)), code::USAGE);
        assert_eq!(exit_code(&ctx, Ok(Outcome::Partial)), code::PARTIAL);
    }

    #[test]
    fn each_signal_has_the_exit_code_a_shell_reports() {
        let codes: Vec<u8> = Interrupt::ALL.iter().map(|i| i.exit_code()).collect();
        assert_eq!(codes, [130, 143, 129]);
        assert!(Interrupt::is_exit_code(143) && !Interrupt::is_exit_code(1));
    }
}
