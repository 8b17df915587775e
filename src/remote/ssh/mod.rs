//! The `ssh` transport: one russh connection per host (through its ProxyJump hops, if any),
//! with exec and direct-tcpip channels multiplexed over it, kept alive with keepalives and
//! re-established when it drops.
//!
//! - [`hop`]: one handshake, host-key check and authentication.
//! - [`jump`]: dialing through jump hosts, shared per process.
//! - [`link`]: noticing a lost connection and redialing with backoff.
//! - [`forward`]: forwarded local ports that survive reconnects.
//!
//! While the link is down, [`Transport::run`] waits for it up to the host's connect timeout
//! (`ConnectTimeout`, else `--connect-timeout`), then fails with [`RemoteError::LinkDown`]; a
//! command in flight when the link drops fails with [`RemoteError::ConnectionLost`] (it may or
//! may not have run, so it is not repeated).

mod forward;
mod hop;
mod jump;
mod link;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt;
use futures::future::BoxFuture;
use russh::client;
use russh::{ChannelMsg, ChannelOpenFailure};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::ssh_config::{self, Resolved};
use super::{
    CommandOutput, ConnectOptions, Link, LinkLoss, RemoteError, Transport, Tunnel, mask, quote_argv,
};
use crate::config::SshTarget;
use hop::Session;
use link::{Dial, Dialed, Keeper};

/// OpenSSH's sshd allows 10 sessions per connection (MaxSessions); stay below it so that
/// forwarded ports and other clients' sessions still fit.
const MAX_CONCURRENT_EXECS: usize = 8;

/// Retries of a refused session open back off from 2 ms, doubling, until this (about 0.5 s).
const SESSION_RETRY_LIMIT: Duration = Duration::from_millis(300);

pub struct SshTransport {
    host: String,
    /// `user@name` with name as known_hosts spells it, for messages and logs.
    target: String,
    keeper: Arc<Keeper<Session>>,
    execs: Semaphore,
    /// How long a command waits for a lost link to come back.
    wait_for_link: Duration,
    supervisor: Option<(CancellationToken, JoinHandle<()>)>,
}

impl fmt::Debug for SshTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SshTransport")
            .field("host", &self.host)
            .field("target", &self.target)
            .finish()
    }
}

impl Drop for SshTransport {
    fn drop(&mut self) {
        if let Some((cancel, _)) = &self.supervisor {
            cancel.cancel();
        }
    }
}

/// Redials the whole chain to one host, under the rules of the first connection.
struct Redial {
    host: String,
    resolved: Resolved,
    opts: ConnectOptions,
}

impl Dial for Redial {
    type Conn = Session;
    fn dial(&self) -> BoxFuture<'_, Result<Dialed<Session>, RemoteError>> {
        Box::pin(async move {
            let (conn, ended) = jump::dial(&self.host, &self.resolved, &self.opts).await?;
            Ok(Dialed {
                conn,
                ended: ended_future(ended),
            })
        })
    }
}

fn ended_future(ended: tokio::sync::oneshot::Receiver<LinkLoss>) -> BoxFuture<'static, LinkLoss> {
    ended.map(|r| r.unwrap_or(LinkLoss::Ended)).boxed()
}

impl SshTransport {
    /// Connects (through the host's jump hosts), verifies every host key and authenticates,
    /// each hop within its connect timeout; then keeps the connection up until dropped.
    /// `host` names the inventory host in messages; `ssh_options` are its own, over
    /// `~/.ssh/config`.
    pub async fn connect(
        host: &str,
        target: &SshTarget,
        ssh_options: &BTreeMap<String, String>,
        opts: &ConnectOptions,
    ) -> Result<Self, RemoteError> {
        let home = std::env::var_os("HOME")
            .filter(|h| !h.is_empty())
            .map(PathBuf::from);
        let resolved =
            ssh_config::resolve(target, ssh_options, home.as_deref()).map_err(|source| {
                RemoteError::Config {
                    host: host.to_string(),
                    source: Box::new(source),
                }
            })?;
        let target_label = format!("{}@{}", resolved.user, resolved.known_hosts_name());
        let hops = resolved.hops();
        if hops.is_empty() {
            tracing::debug!(host = %host, "ssh: connecting to {target_label}");
        } else {
            tracing::debug!(host = %host, "ssh: connecting to {target_label} through {}", hops.join(", "));
        }
        let (session, ended) = jump::dial(host, &resolved, opts).await?;
        let keeper = Arc::new(Keeper::new(session));
        let cancel = CancellationToken::new();
        let wait_for_link = resolved.connect_timeout.unwrap_or(opts.connect_timeout);
        let supervisor = tokio::spawn(link::supervise(
            Redial {
                host: host.to_string(),
                resolved,
                opts: opts.clone(),
            },
            ended_future(ended),
            keeper.clone(),
            link::RECONNECT,
            host.to_string(),
            target_label.clone(),
            cancel.clone(),
        ));
        Ok(SshTransport {
            host: host.to_string(),
            target: target_label,
            keeper,
            execs: Semaphore::new(MAX_CONCURRENT_EXECS),
            wait_for_link,
            supervisor: Some((cancel, supervisor)),
        })
    }

    /// Stops reconnecting and waits for the supervisor to end; dropping does the first only.
    pub async fn close(mut self) {
        if let Some((cancel, task)) = self.supervisor.take() {
            cancel.cancel();
            let _ = task.await;
        }
    }

    /// The connection, waiting for a lost one to come back up to `wait_for_link`.
    async fn session(&self) -> Result<Arc<Session>, RemoteError> {
        match self.keeper.wait_up(self.wait_for_link).await {
            Ok(session) => Ok(session),
            Err(Link::Failed { error, .. }) => Err(RemoteError::LinkFailed {
                host: self.host.clone(),
                error,
            }),
            Err(Link::Down { reason, .. }) => Err(RemoteError::LinkDown {
                host: self.host.clone(),
                target: self.target.clone(),
                reason,
                waited: self.wait_for_link,
            }),
            Err(Link::Up { .. }) => Err(RemoteError::LinkDown {
                host: self.host.clone(),
                target: self.target.clone(),
                reason: LinkLoss::Ended,
                waited: self.wait_for_link,
            }),
        }
    }

    /// sshd frees a session slot only when it garbage-collects the closed channel, which can be
    /// after it has already read our next open request; such a refusal is retried briefly.
    async fn open_session(
        &self,
        session: &Session,
    ) -> Result<russh::Channel<client::Msg>, RemoteError> {
        let mut delay = Duration::from_millis(2);
        loop {
            match session.handle.channel_open_session().await {
                Err(russh::Error::ChannelOpenFailure(
                    ChannelOpenFailure::ConnectFailed | ChannelOpenFailure::ResourceShortage,
                )) if delay < SESSION_RETRY_LIMIT => {
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                other => return other.map_err(|e| self.broken(e)),
            }
        }
    }

    fn broken(&self, e: russh::Error) -> RemoteError {
        RemoteError::Ssh {
            host: self.host.clone(),
            target: self.target.clone(),
            message: e.to_string(),
        }
    }
}

#[async_trait]
impl Transport for SshTransport {
    fn host(&self) -> &str {
        &self.host
    }

    async fn run_input(&self, argv: &[String], input: &[u8]) -> Result<CommandOutput, RemoteError> {
        let command = quote_argv(&self.host, argv)?;
        tracing::debug!(host = %self.host, "ssh {}: {}", self.target, mask(&command));
        let _permit = self.execs.acquire().await.map_err(|_| RemoteError::Ssh {
            host: self.host.clone(),
            target: self.target.clone(),
            message: "connection closed".into(),
        })?;
        let session = self.session().await?;
        let lost = || RemoteError::ConnectionLost {
            host: self.host.clone(),
            target: self.target.clone(),
            command: mask(&command),
        };
        let mut channel = self
            .open_session(&session)
            .await
            .map_err(|e| if session.is_closed() { lost() } else { e })?;
        channel
            .exec(true, command.as_bytes())
            .await
            .map_err(|_| lost())?;
        // After the input, a program reading its stdin must see end of file.
        if !input.is_empty() {
            channel.data(input).await.map_err(|_| lost())?;
        }
        channel.eof().await.map_err(|_| lost())?;

        let mut out = CommandOutput::default();
        // Output may still arrive after EOF and exit-status; only Close ends the channel.
        while let Some(msg) = channel.wait().await {
            match msg {
                ChannelMsg::Data { data } => out.stdout.extend_from_slice(&data),
                ChannelMsg::ExtendedData { data, ext: 1 } => out.stderr.extend_from_slice(&data),
                ChannelMsg::ExitStatus { exit_status } => {
                    out.status = i32::try_from(exit_status).ok()
                }
                ChannelMsg::Failure => {
                    return Err(RemoteError::Command {
                        host: self.host.clone(),
                        command: mask(&command),
                        status: "refused by the server".into(),
                        stderr: String::new(),
                    });
                }
                ChannelMsg::Close => break,
                _ => {}
            }
        }
        if out.status.is_none() && session.is_closed() {
            return Err(lost());
        }
        Ok(out)
    }

    async fn forward(&self, addr: &str, port: u16) -> Result<Tunnel, RemoteError> {
        let forward_err = |message: String| RemoteError::Forward {
            host: self.host.clone(),
            addr: addr.to_string(),
            port,
            message,
        };
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| forward_err(e.to_string()))?;
        let local = listener
            .local_addr()
            .map_err(|e| forward_err(e.to_string()))?;
        tracing::debug!(host = %self.host, "ssh {}: forwarding {local} -> {addr}:{port}", self.target);
        let cancel = CancellationToken::new();
        let task = tokio::spawn(forward::serve(
            listener,
            self.keeper.clone(),
            forward::Destination {
                host: self.host.clone(),
                addr: addr.to_string(),
                port,
            },
            cancel.clone(),
        ));
        Ok(Tunnel::forwarded(local, cancel, task))
    }

    /// Up, down while reconnecting, or failed for good; see the module docs.
    fn link(&self) -> watch::Receiver<Link> {
        self.keeper.link()
    }
}
