//! `fleet exec`: run one argv on every host of the inventory (or one), in parallel, and show
//! each host's output under its name.

use serde::Serialize;

use crate::cli::ExecArgs;
use crate::config::Inventory;
use crate::launch::Fleet;
use crate::render::Model;

use super::{Ctx, Outcome, UsageError};

/// What one host answered; `error` when it could not be reached or the command not started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostRun {
    pub host: String,
    pub status: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub error: Option<String>,
}

/// `fleet exec`'s result: what every host answered.
#[derive(Serialize)]
#[serde(transparent)]
pub struct Runs(pub Vec<HostRun>);

impl Model for Runs {
    fn title(&self) -> String {
        "fleet exec".into()
    }

    fn text(&self) -> String {
        render(&self.0)
    }
}

impl HostRun {
    fn succeeded(&self) -> bool {
        self.error.is_none() && self.status == Some(0)
    }
}

pub async fn run(ctx: &Ctx, args: &ExecArgs) -> anyhow::Result<Outcome> {
    let inventory = crate::config::load_inventory(&ctx.global.config)?;
    let hosts = match &args.host {
        None => inventory.hosts.clone(),
        Some(name) => match inventory.hosts.iter().find(|h| h.name() == name) {
            Some(h) => vec![h.clone()],
            None => {
                let known: Vec<&str> = inventory.hosts.iter().map(|h| h.name()).collect();
                return Err(UsageError::new(format!(
                    "--host {name}: no such host in {} (hosts: {})",
                    inventory.path.display(),
                    known.join(", ")
                ))
                .into());
            }
        },
    };
    let chosen = Inventory { hosts, ..inventory };
    let runs = async {
        let fleet = Fleet::connect(chosen, &ctx.connect_options()).await;
        let runs = fleet
            .inventory
            .hosts
            .iter()
            .map(|h| run_on(&fleet, h.name(), &args.argv));
        futures::future::join_all(runs).await
    };
    let results = tokio::select! {
        results = runs => results,
        _ = ctx.cancel.cancelled() => return Ok(Outcome::Interrupted),
    };
    let results = Runs(results);
    super::emit(ctx, &results)?;
    Ok(if results.0.iter().all(HostRun::succeeded) {
        Outcome::Ok
    } else {
        Outcome::Partial
    })
}

/// Runs `argv` on `host`'s shell.
async fn run_on(fleet: &Fleet, host: &str, argv: &[String]) -> HostRun {
    let result = match fleet.backend(host) {
        Some(b) => b.shell().run(argv).await.map_err(|e| e.to_string()),
        None => Err(fleet
            .why_unreachable(host)
            .map_or_else(String::new, ToString::to_string)),
    };
    match result {
        Ok(out) => HostRun {
            host: host.to_string(),
            status: out.status,
            stdout: out.stdout_lossy(),
            stderr: out.stderr_lossy(),
            error: None,
        },
        Err(e) => HostRun {
            host: host.to_string(),
            status: None,
            stdout: String::new(),
            stderr: String::new(),
            error: Some(e),
        },
    }
}

/// `== host ==` then its stdout, then its stderr after `-- stderr --`; a failure is in the header.
fn render(results: &[HostRun]) -> String {
    let mut text = String::new();
    for r in results {
        let state = match (&r.error, r.status) {
            (Some(_), _) => " (unreachable)".to_string(),
            (None, Some(0)) => String::new(),
            (None, Some(code)) => format!(" (exit {code})"),
            (None, None) => " (killed by a signal)".to_string(),
        };
        text.push_str(&format!("== {}{state} ==\n", r.host));
        push_block(&mut text, &r.stdout);
        if !r.stderr.is_empty() {
            text.push_str("-- stderr --\n");
            push_block(&mut text, &r.stderr);
        }
        if let Some(error) = &r.error {
            push_block(&mut text, error);
        }
    }
    text
}

/// Appends `block`, ending it with a newline so the next header starts on its own line.
fn push_block(text: &mut String, block: &str) {
    if block.is_empty() {
        return;
    }
    text.push_str(block);
    if !block.ends_with('\n') {
        text.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host_run(
        host: &str,
        status: Option<i32>,
        stdout: &str,
        stderr: &str,
        error: Option<&str>,
    ) -> HostRun {
        HostRun {
            host: host.into(),
            status,
            stdout: stdout.into(),
            stderr: stderr.into(),
            error: error.map(String::from),
        }
    }

    #[test]
    fn each_host_gets_a_header_with_its_failure() {
        let text = render(&[
            host_run("gpu1", Some(0), "ok\n", "", None),
            host_run("gpu2", Some(3), "partial", "boom\n", None),
            host_run("gpu3", None, "", "", Some("gpu3: cannot connect")),
        ]);
        assert_eq!(
            text,
            "== gpu1 ==\nok\n== gpu2 (exit 3) ==\npartial\n-- stderr --\nboom\n\
             == gpu3 (unreachable) ==\ngpu3: cannot connect\n"
        );
    }

    #[test]
    fn success_means_reached_and_exit_zero() {
        assert!(host_run("a", Some(0), "", "", None).succeeded());
        assert!(!host_run("a", Some(1), "", "", None).succeeded());
        assert!(!host_run("a", None, "", "", None).succeeded());
        assert!(!host_run("a", None, "", "", Some("x")).succeeded());
    }
}
