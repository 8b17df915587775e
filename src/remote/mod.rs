//! Reaching hosts: the one `Transport` trait (run an argv, start a detached process, forward a
//! TCP port, watch the connection's [`Link`]) and its implementations: `local`, `ssh` (one
//! multiplexed russh connection per host, through ProxyJump hops, re-established when it drops)
//! and `pct` (wraps another transport as `pct exec <CT> -- bash -c <quoted script>`).
//!
//! A command is always an argv. Where a shell must parse it (the SSH exec request, `bash -c`
//! inside a container), every word is POSIX-quoted by [`quote_argv`], so values reach the
//! program as literal data.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::{MachineSpec, SshTarget};

mod detach;
mod local;
mod pct;
mod secrets;
mod ssh;
mod ssh_config;

pub(crate) use detach::{parse_started, spawn_argv};
pub use local::LocalTransport;
pub use pct::PctTransport;
pub use secrets::{LineMask, add_secret, mask};
pub use ssh::SshTransport;
pub use ssh_config::directives;
pub(crate) use ssh_config::local_user;
pub use ssh_config::{Origin as SshConfigOrigin, SshConfigError};

/// An argv for [`Transport::run`] from string slices.
pub fn argv(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

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

/// The state of a transport's connection to its host, as [`Transport::link`] publishes it.
///
/// A consumer (the generate dispatcher) treats `Down` as "host lost" and the next `Up` as
/// "host back"; `generation` tells a reconnect apart from the first connection even when the
/// `Down` in between was never observed (a watch channel keeps only the latest value).
#[derive(Debug, Clone)]
pub enum Link {
    /// Connected. `generation` is 0 for the first connection and counts reconnects.
    Up { generation: u64 },
    /// Lost at `since` for `reason`; the transport is reconnecting with backoff.
    Down { since: Instant, reason: LinkLoss },
    /// Reconnecting was refused in a way retrying cannot fix (a changed or unknown host key,
    /// refused authentication, a bad configuration): the transport stays down for good.
    Failed {
        since: Instant,
        error: Arc<RemoteError>,
    },
}

impl Link {
    pub fn is_up(&self) -> bool {
        matches!(self, Link::Up { .. })
    }
}

/// Why an established connection ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkLoss {
    /// `max` keepalives in a row went unanswered (OpenSSH's ServerAliveCountMax).
    #[error("no answer to {max} keepalives sent {interval:?} apart")]
    Keepalive { interval: Duration, max: usize },
    /// The server said goodbye (SSH_MSG_DISCONNECT).
    #[error("the server closed the connection: {message}")]
    Closed { message: String },
    /// The stream failed or ended (EOF, reset, a broken jump host).
    #[error("{message}")]
    Broken { message: String },
    /// The session ended without saying why.
    #[error("the connection ended")]
    Ended,
}

static ALWAYS_UP: std::sync::LazyLock<watch::Sender<Link>> =
    std::sync::LazyLock::new(|| watch::Sender::new(Link::Up { generation: 0 }));

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
    #[error(
        "{host}: cannot connect to {target}: {source}\n  hint: check that the host is up and that \
         sshd listens on that port (HostName/Port in fleet.yaml, its ssh_options or ~/.ssh/config)"
    )]
    Unreachable {
        host: String,
        target: String,
        source: std::io::Error,
    },

    #[error(
        "{host}: no SSH session with {target} within {after:?}\n  hint: check that the address \
         and port are right and reach an SSH server (firewall, VPN); for slow links raise \
         --connect-timeout or the host's ConnectTimeout"
    )]
    Timeout {
        host: String,
        target: String,
        after: Duration,
    },

    #[error(
        "{host}: the host key of {target} is unknown ({fingerprint}), refusing to connect\n  \
         hint: verify the fingerprint out of band (e.g. `ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub` \
         on the host), then rerun with --accept-new-host-key to record it in {}",
        .known_hosts.display()
    )]
    UnknownHostKey {
        host: String,
        target: String,
        fingerprint: String,
        known_hosts: PathBuf,
    },

    #[error(
        "{host}: the host key of {target} has CHANGED ({fingerprint}) and does not match {}:{line}; \
         refusing to connect (possible man-in-the-middle)\n  hint: if the host was reinstalled, \
         remove that line (`ssh-keygen -R '{target}' -f {}`) and connect again",
        .known_hosts.display(), .known_hosts.display()
    )]
    HostKeyChanged {
        host: String,
        target: String,
        fingerprint: String,
        known_hosts: PathBuf,
        line: usize,
    },

    #[error(
        "{host}: {user}@{target} refused authentication; tried: {}\n  hint: check that one of these \
         keys is authorized for {user} on the host (~{user}/.ssh/authorized_keys), and the User and \
         IdentityFile in ~/.ssh/config or the host's ssh_options",
        tried_list(.tried)
    )]
    AuthRefused {
        host: String,
        user: String,
        target: String,
        tried: Vec<String>,
    },

    #[error(
        "{host}: container {container} is not running or does not exist: {detail}\n  hint: check \
         `pct status {container}` on the host and the `container:` id in fleet.yaml"
    )]
    ContainerNotRunning {
        host: String,
        container: u32,
        detail: String,
    },

    #[error("{host}: SSH configuration: {source}")]
    Config {
        host: String,
        source: Box<SshConfigError>,
    },

    #[error("{host}: cannot use known_hosts: {message}")]
    KnownHosts { host: String, message: String },

    #[error("{host}: cannot reach {target} through {via}: {source}")]
    Jump {
        host: String,
        /// The alias of the host that was to be reached.
        target: String,
        /// The jump hosts, first hop first.
        via: String,
        /// What failed, naming the hop it failed at.
        source: Box<RemoteError>,
    },

    #[error("{host}: cannot open a connection to {to}: {reason}")]
    Tunnel {
        host: String,
        to: String,
        reason: String,
    },

    #[error(
        "{host}: the SSH connection to {target} is down ({reason}) and did not come back within \
         {waited:?}\n  hint: fleet keeps reconnecting in the background; check that the host \
         is up and reachable"
    )]
    LinkDown {
        host: String,
        target: String,
        reason: LinkLoss,
        waited: Duration,
    },

    #[error("{error}\n  (the connection to this host was lost; fleet stopped reconnecting)")]
    LinkFailed {
        host: String,
        error: Arc<RemoteError>,
    },

    #[error("{host}: the SSH connection to {target} was lost while running `{command}`")]
    ConnectionLost {
        host: String,
        target: String,
        command: String,
    },

    #[error("{host}: SSH connection to {target} failed: {message}")]
    Ssh {
        host: String,
        target: String,
        message: String,
    },

    #[error("{host}: cannot start `{program}`: {source}")]
    Spawn {
        host: String,
        program: String,
        source: std::io::Error,
    },

    #[error("{host}: argument {arg:?} contains a NUL byte and cannot be passed to a remote shell")]
    Quote { host: String, arg: String },

    #[error("{host}: `{command}` failed ({status}): {stderr}")]
    Command {
        host: String,
        command: String,
        status: String,
        stderr: String,
    },

    #[error("{host}: cannot forward a local port to {addr}:{port}: {message}")]
    Forward {
        host: String,
        addr: String,
        port: u16,
        message: String,
    },
}

fn tried_list(tried: &[String]) -> String {
    if tried.is_empty() {
        "no keys (no ssh-agent and none of ~/.ssh/id_ed25519, id_ecdsa, id_rsa)".to_string()
    } else {
        tried.join(", ")
    }
}

/// One way of running things on a target. Every fleet operation goes through this trait.
#[async_trait]
pub trait Transport: Send + Sync + fmt::Debug {
    /// The inventory name of the host, for messages.
    fn host(&self) -> &str;

    /// Runs an argv (never a shell string) and captures its output and exit status; its stdin
    /// is empty.
    async fn run(&self, argv: &[String]) -> Result<CommandOutput, RemoteError> {
        self.run_input(argv, &[]).await
    }

    /// [`Transport::run`] with `input` on the program's stdin, then end of file: how bytes get
    /// to a target (a prompt file, fleet's own executable) without a second channel.
    async fn run_input(&self, argv: &[String], input: &[u8]) -> Result<CommandOutput, RemoteError>;

    /// Starts a process detached in its own session (`setsid`), with its output in `log`,
    /// and returns its pid (also its process group id), which is written to `pidfile`.
    ///
    /// Built on [`Transport::run`] once for every transport, so a `pct` target starts it
    /// inside the container and an SSH target on the host; it outlives the SSH session.
    async fn spawn_detached(&self, d: &Detached) -> Result<u32, RemoteError> {
        let argv = detach::spawn_argv(self.host(), d)?;
        let out = self.run(&argv).await?;
        detach::parse_pid(self.host(), d, &out)
    }

    /// Opens a local TCP port forwarded to `addr:port` as seen from the target.
    async fn forward(&self, addr: &str, port: u16) -> Result<Tunnel, RemoteError>;

    /// The address at which servers on this target are reached, as seen from the machine the
    /// transport connects through (for `forward`): loopback for a host, the container's address
    /// for a `pct` target.
    async fn server_address(&self) -> Result<String, RemoteError> {
        Ok("127.0.0.1".to_string())
    }

    /// The state of the connection to the host, updated as it is lost and re-established.
    ///
    /// The SSH transport reconnects by itself (see [`SshTransport`]); `pct` reports its inner
    /// transport's link. This default, for transports that never drop (local), is always
    /// `Up { generation: 0 }`, and its `changed()` never fires.
    fn link(&self) -> watch::Receiver<Link> {
        ALWAYS_UP.subscribe()
    }
}

impl RemoteError {
    /// Whether the host may answer again by itself: its connection is down, dropped or
    /// timed out (as opposed to a refusal that retrying cannot change).
    pub fn is_outage(&self) -> bool {
        matches!(
            self,
            RemoteError::Unreachable { .. }
                | RemoteError::Timeout { .. }
                | RemoteError::LinkDown { .. }
                | RemoteError::ConnectionLost { .. }
                | RemoteError::Tunnel { .. }
                | RemoteError::Ssh { .. }
        )
    }
}

/// POSIX-quotes each word and joins them with spaces: the one way an argv becomes a string
/// for a remote shell. A NUL byte cannot be expressed in a shell word and is refused.
pub fn quote_argv(host: &str, argv: &[String]) -> Result<String, RemoteError> {
    let mut words = Vec::with_capacity(argv.len());
    for arg in argv {
        let quoted = shlex::try_quote(arg).map_err(|_| RemoteError::Quote {
            host: host.to_string(),
            arg: mask(arg),
        })?;
        words.push(quoted);
    }
    Ok(words.join(" "))
}

/// Opens the transport for a machine of the inventory: its shell ([`shell`]), wrapped in `pct`
/// for a container.
pub async fn connect(
    machine: &MachineSpec,
    opts: &ConnectOptions,
) -> Result<Arc<dyn Transport>, RemoteError> {
    let base = shell(
        &machine.name,
        machine.ssh.as_ref(),
        &machine.ssh_options,
        opts,
    )
    .await?;
    Ok(match machine.container {
        None => base,
        Some(ct) => Arc::new(PctTransport::new(base, ct, machine.address.clone())),
    })
}

/// A shell on this machine (`ssh` is `None`), or over SSH with the host's own options: where
/// every host kind runs its commands.
pub async fn shell(
    host: &str,
    ssh: Option<&SshTarget>,
    ssh_options: &BTreeMap<String, String>,
    opts: &ConnectOptions,
) -> Result<Arc<dyn Transport>, RemoteError> {
    Ok(match ssh {
        None => Arc::new(LocalTransport::new(host)),
        Some(target) => Arc::new(SshTransport::connect(host, target, ssh_options, opts).await?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_keeps_shell_syntax_literal() {
        let argv: Vec<String> = ["echo", "x; touch /tmp/p", "$(id)", "it's", "a\nb", "*", ""]
            .map(String::from)
            .into();
        let q = quote_argv("h", &argv).unwrap();
        assert_eq!(shlex::split(&q).unwrap(), argv);
        assert!(!q.contains(" x; "), "{q}");
    }

    #[test]
    fn nul_is_refused_with_the_host() {
        let err = quote_argv("gpu1", &["a\0b".to_string()]).unwrap_err();
        assert!(err.to_string().starts_with("gpu1: argument"), "{err}");
    }
}
