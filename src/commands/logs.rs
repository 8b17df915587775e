//! `fleet logs INSTANCE [-n N] [-f]`: an instance's server log.

use tokio::sync::mpsc;

use crate::cli::LogsArgs;
use crate::config;
use crate::jobs;
use crate::launch::Fleet;
use crate::launch::logs::{self, Selector};

use super::{Ctx, Outcome, UsageError, output};

pub async fn run(ctx: &Ctx, args: &LogsArgs) -> anyhow::Result<Outcome> {
    let inventory = config::load_inventory(&ctx.global.config)?;
    if args.instance == "router" {
        let fleet = Fleet::connect(inventory, &ctx.connect_options()).await;
        fleet.log_unreachable();
        let (t, path) = super::router::log(&fleet).await?;
        return follow(ctx, t, &path, args).await;
    }
    let selector = match Selector::parse(&args.instance) {
        Ok(s) => s,
        // Neither host:gpu nor a port: a detached job's id.
        Err(_) if !args.instance.contains(':') => {
            let fleet = Fleet::connect(inventory, &ctx.connect_options()).await;
            fleet.log_unreachable();
            let (t, view) = jobs::find(&fleet.shells(), fleet.run_root(), &args.instance)
                .await
                .map_err(UsageError::new)?;
            return follow(ctx, t, &jobs::log_path(&view.record), args).await;
        }
        Err(e) => return Err(UsageError::new(e).into()),
    };
    if let Selector::HostGpu { host, .. } = &selector
        && !inventory.hosts.iter().any(|h| h.name() == host)
    {
        return Err(
            UsageError::new(format!("no host `{host}` in {}", inventory.path.display())).into(),
        );
    }
    let fleet = Fleet::connect(inventory, &ctx.connect_options()).await;
    fleet.log_unreachable();
    let (t, path) = logs::locate(&fleet, &selector).await?;
    tracing::debug!("{}: {path}", t.host());
    follow(ctx, t, &path, args).await
}

/// Prints the last lines of `path` on `t`, and with `-f` what is appended until Ctrl-C.
async fn follow(
    ctx: &Ctx,
    t: std::sync::Arc<dyn crate::remote::Transport>,
    path: &str,
    args: &LogsArgs,
) -> anyhow::Result<Outcome> {
    let (sender, mut receiver) = mpsc::unbounded_channel::<Vec<u8>>();
    // Ends when stdout is gone (`fleet logs -f X | head`), which ends the reading too.
    let printer = tokio::spawn(async move {
        while let Some(chunk) = receiver.recv().await {
            if !output::stdout(&chunk) {
                break;
            }
        }
    });
    let result = logs::read(
        t.as_ref(),
        path,
        args.lines,
        args.follow,
        &sender,
        &ctx.cancel,
    )
    .await;
    drop(sender);
    printer.await?;
    result?;
    Ok(if ctx.cancel.is_cancelled() {
        Outcome::Interrupted
    } else {
        Outcome::Ok
    })
}
