//! Reads that run only under this `up`'s run directory lock: a [`Transport`] whose every command
//! first waits, on the target, until the lock file names this `up`'s token, so the look at what
//! runs can be sent beside the `take` instead of after it (through `pct exec`, a second saved).
//!
//! A command that finds the lock another's, or not taken within [`WAIT_TICKS`], does not run;
//! the gate remembers that, and the look is made again once the lock is held.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use tokio::sync::watch;

use crate::remote::{CommandOutput, Link, RemoteError, Transport, Tunnel};

/// `$1` run root, `$2` token, then the command. The lock file is replaced whole (`mv`), so one
/// `head` sees either the old holder or the new one; a token once ours stays ours until this
/// `up` releases it, which it does only after the look.
const SCRIPT: &str = r#"lock=${1%/}.up.lock; token=$2; shift 2
i=0
while :; do
  held=$(head -n 1 "$lock" 2>/dev/null)
  [ "$held" = "$token" ] && exec "$@"
  [ -n "$held" ] && { echo "fleet-gate: $lock is another's" >&2; exit 75; }
  i=$((i + 1))
  [ "$i" -gt 500 ] && { echo "fleet-gate: $lock not taken within 5s" >&2; exit 75; }
  sleep 0.01
done"#;

/// Polls of the lock file (10 ms apart) before a command gives up waiting for the `take`.
pub const WAIT_TICKS: u32 = 500;

/// The transport `inner`, each command gated on the lock `token` over `root`.
#[derive(Debug)]
pub struct Gate {
    inner: Arc<dyn Transport>,
    root: String,
    token: String,
    refused: AtomicBool,
}

impl Gate {
    pub fn new(inner: Arc<dyn Transport>, root: &str, token: &str) -> Arc<Gate> {
        Arc::new(Gate {
            inner,
            root: root.to_string(),
            token: token.to_string(),
            refused: AtomicBool::new(false),
        })
    }

    /// Whether some command did not run because the lock was not this `up`'s: what was read
    /// through the gate is then not to be trusted.
    pub fn refused(&self) -> bool {
        self.refused.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Transport for Gate {
    fn host(&self) -> &str {
        self.inner.host()
    }

    async fn run_input(&self, argv: &[String], input: &[u8]) -> Result<CommandOutput, RemoteError> {
        let mut gated: Vec<String> = ["sh", "-c", SCRIPT, "fleet-gate", &self.root, &self.token]
            .map(String::from)
            .into();
        gated.extend_from_slice(argv);
        let out = self.inner.run_input(&gated, input).await;
        let shut = |o: &CommandOutput| o.status == Some(75) && o.stderr.starts_with(b"fleet-gate:");
        if out.as_ref().map_or(true, shut) {
            self.refused.store(true, Ordering::SeqCst);
        }
        out
    }

    async fn forward(&self, addr: &str, port: u16) -> Result<Tunnel, RemoteError> {
        self.inner.forward(addr, port).await
    }

    async fn server_address(&self) -> Result<String, RemoteError> {
        self.inner.server_address().await
    }

    fn link(&self) -> watch::Receiver<Link> {
        self.inner.link()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::LocalTransport;

    fn argv(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    #[tokio::test]
    async fn a_command_runs_only_once_the_lock_is_this_ups() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("fleet");
        let lock = dir.path().join("fleet.up.lock");
        let local: Arc<dyn Transport> = Arc::new(LocalTransport::new("here"));
        let gate = Gate::new(local, root.to_str().unwrap(), "mine");
        // Taken a moment after the read was sent: the read waits for it, then runs.
        let cat = argv(&["sh", "-c", "echo read; cat \"$0\"", lock.to_str().unwrap()]);
        let read = gate.run(&cat);
        let take = async {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            std::fs::write(&lock, "mine\n{}\n").unwrap();
        };
        let (out, ()) = tokio::join!(read, take);
        let out = out.unwrap();
        assert!(out.success(), "{}", out.stderr_lossy());
        assert_eq!(out.stdout_lossy(), "read\nmine\n{}\n");
        assert!(!gate.refused());

        // Another's lock: the command does not run, and the gate says so.
        std::fs::write(&lock, "theirs\n{}\n").unwrap();
        let marker = dir.path().join("ran");
        let out = gate
            .run(&argv(&["touch", marker.to_str().unwrap()]))
            .await
            .unwrap();
        assert_eq!(out.status, Some(75));
        assert!(out.stderr_lossy().contains("is another's"), "{out:?}");
        assert!(!marker.exists());
        assert!(gate.refused());
    }

    #[tokio::test]
    async fn a_command_of_its_own_that_exits_75_does_not_shut_the_gate() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("fleet");
        std::fs::write(dir.path().join("fleet.up.lock"), "mine\n").unwrap();
        let local: Arc<dyn Transport> = Arc::new(LocalTransport::new("here"));
        let gate = Gate::new(local, root.to_str().unwrap(), "mine");
        let out = gate.run(&argv(&["sh", "-c", "exit 75"])).await.unwrap();
        assert_eq!(out.status, Some(75));
        assert!(!gate.refused());
    }
}
