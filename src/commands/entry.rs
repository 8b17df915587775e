//! The `fleet` process from start to exit code: the multi-call check, the panic hook, argument
//! parsing, logging, the runtime, and the dispatch of one command.
//!
//! It lives in the library, not in `main.rs`: the async dispatch is one large future, and a
//! future only the binary polls was compiled again, monomorphised, in the binary's own crate
//! (some 140 s of a release build on 2 cores, on top of the library's).

use std::process::ExitCode;

use clap::Parser;

use crate::cli::Cli;
use crate::commands::{self, Ctx};

/// Runs `fleet` (or `sglang-sim`, by the name it was invoked as) and returns its exit code.
pub fn main() -> ExitCode {
    // A multi-call binary: under the name `sglang-sim` (a link `fleet demo` makes), fleet is the
    // simulator, so the demo needs nothing but this one executable.
    let invoked_as = std::env::args_os().next().map(std::path::PathBuf::from);
    if invoked_as
        .as_deref()
        .and_then(|p| p.file_stem())
        .is_some_and(|n| n == "sglang-sim")
    {
        return crate::sim::main();
    }
    // A panic is a bug: say so, where, and exit 70 rather than leave a half-done command to
    // look like one that failed for a reason the user can fix.
    std::panic::set_hook(Box::new(|info| {
        let text = commands::internal_error(info);
        crate::commands::output::stderr(format!("{text}\n").as_bytes());
        std::process::exit(commands::code::INTERNAL.into());
    }));
    let cli = Cli::parse();
    commands::init_logging(&cli.global);
    // Every request a job has in flight holds a socket: the soft default (often 1024) is no
    // limit to work within when the hard one allows more.
    commands::nofile::raise();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            crate::commands::output::stderr(
                format!("error: cannot start the async runtime: {e}\n").as_bytes(),
            );
            return ExitCode::from(commands::code::FAILED);
        }
    };
    let code = runtime.block_on(async move {
        let ctx = Ctx::new(cli.global.clone());
        ctx.watch_signals();
        // Test hook: the integration tests' only way to provoke a panic (a bug) in the binary.
        if std::env::var_os("FLEET_TEST_HOOK_PANIC").is_some() {
            panic!("FLEET_TEST_HOOK_PANIC is set");
        }
        let result = commands::dispatch(&ctx, cli.command).await;
        commands::exit_code(&ctx, result)
    });
    // Servers and tunnels are owned by joined tasks; nothing left must hold the process open.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    ExitCode::from(code)
}
