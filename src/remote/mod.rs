//! Reaching hosts: the one `Transport` trait (run an argv, start a detached process, forward a
//! TCP port) and its implementations: `local`, `ssh` (one multiplexed russh connection per host)
//! and `pct` (wraps another transport as `pct exec <CT> -- bash -c <quoted script>`).

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::HostSpec;

/// What a finished command left behind. Each stream was read until its channel closed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommandOutput {
    /// Exit status; `None` when the process was killed by a signal or the status never came.
    pub status: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl CommandOutput {
    pub fn success(&self) -> bool {
        self.status == Some(0)
    }
    pub fn stdout_lossy(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    pub fn stderr_lossy(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

/// A process to start in its own session, outliving the command that started it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detached {
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// stdout and stderr go here, on the target.
    pub log: String,
    /// The process (group leader) id is written here, on the target.
    pub pidfile: String,
}

/// A local TCP port forwarded to an address as seen from the target. Dropping it stops the
/// forwarding; `close` also waits for the forwarding task to end.
pub struct Tunnel {
    local: SocketAddr,
    task: Option<(CancellationToken, JoinHandle<()>)>,
}

impl Tunnel {
    /// A "tunnel" that is just the address itself, for targets reachable directly.
    pub fn direct(addr: SocketAddr) -> Self {
        Tunnel {
            local: addr,
            task: None,
        }
    }
    pub fn forwarded(local: SocketAddr, cancel: CancellationToken, task: JoinHandle<()>) -> Self {
        Tunnel {
            local,
            task: Some((cancel, task)),
        }
    }
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }
    pub async fn close(mut self) {
        if let Some((cancel, task)) = self.task.take() {
            cancel.cancel();
            let _ = task.await;
        }
    }
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        if let Some((cancel, _)) = &self.task {
            cancel.cancel();
        }
    }
}

impl fmt::Debug for Tunnel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tunnel")
            .field("local", &self.local)
            .finish()
    }
}

#[derive(Debug, Clone)]
pub struct ConnectOptions {
    pub accept_new_host_key: bool,
    pub connect_timeout: Duration,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            accept_new_host_key: false,
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// Errors reaching or using a host. Each names the host and says what to check.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("{host}: {message}")]
    Other { host: String, message: String },
}

/// One way of running things on a target. Every fleet operation goes through this trait.
#[async_trait]
pub trait Transport: Send + Sync + fmt::Debug {
    /// The inventory name of the host, for messages.
    fn host(&self) -> &str;

    /// Runs an argv (never a shell string) and captures its output and exit status.
    async fn run(&self, argv: &[String]) -> Result<CommandOutput, RemoteError>;

    /// Starts a process detached in its own session (`setsid`), with its output in `log`,
    /// and returns its pid (also its process group id), which is written to `pidfile`.
    async fn spawn_detached(&self, d: &Detached) -> Result<u32, RemoteError>;

    /// Opens a local TCP port forwarded to `addr:port` as seen from the target.
    async fn forward(&self, addr: &str, port: u16) -> Result<Tunnel, RemoteError>;
}

/// Opens the transport for an inventory host: local or SSH, wrapped in `pct` for a container.
pub async fn connect(
    host: &HostSpec,
    opts: &ConnectOptions,
) -> Result<Arc<dyn Transport>, RemoteError> {
    let _ = (host, opts);
    Err(RemoteError::Other {
        host: host.name.clone(),
        message: "transports not built yet".into(),
    })
}
