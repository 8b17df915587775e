//! Dialing a host, directly or through its ProxyJump chain: each hop's SSH handshake runs over
//! a direct-tcpip channel of the hop before, with the same host-key and authentication rules
//! as a direct connection. Jump connections are shared, per process, by every host behind the
//! same jump host (keyed by the jump's resolved `user@host:port` and its own hops).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, Weak};

use futures::future::BoxFuture;
use russh::ChannelOpenFailure;
use tokio::net::TcpStream;
use tokio::sync::oneshot;

use super::super::ssh_config::Resolved;
use super::super::{ConnectOptions, LinkLoss, RemoteError};
use super::hop::{Session, handshake};

type Slot = Arc<tokio::sync::Mutex<Weak<Session>>>;

/// A connection, and what says why it ended once it has.
type Dialed = (Arc<Session>, oneshot::Receiver<LinkLoss>);

/// Jump connections by [`Resolved::identity`]. Weak: a jump connection lives as long as some
/// connection through it does, and a dead one is redialed by the next host that needs it.
static JUMPS: LazyLock<Mutex<HashMap<String, Slot>>> = LazyLock::new(Default::default);

/// A fresh connection to `r` (named `host` in errors), through its jump hosts if it has any.
pub(super) fn dial<'a>(
    host: &'a str,
    r: &'a Resolved,
    opts: &'a ConnectOptions,
) -> BoxFuture<'a, Result<Dialed, RemoteError>> {
    Box::pin(async move {
        let via = match &r.jump {
            None => None,
            Some(j) => Some(jump(j, opts).await.map_err(|e| through(host, r, e))?),
        };
        let timeout = r.connect_timeout.unwrap_or(opts.connect_timeout);
        let name = r.known_hosts_name();
        let attempt = async {
            match via {
                None => {
                    let stream = TcpStream::connect((r.hostname.as_str(), r.port))
                        .await
                        .map_err(|source| RemoteError::Unreachable {
                            host: host.to_string(),
                            target: name.clone(),
                            source,
                        })?;
                    // Small exec requests and replies: waiting for Nagle only adds latency.
                    stream
                        .set_nodelay(true)
                        .map_err(|source| RemoteError::Unreachable {
                            host: host.to_string(),
                            target: name.clone(),
                            source,
                        })?;
                    handshake(host, r, stream, opts, None).await
                }
                Some(via) => {
                    let channel = open_channel(&via, r)
                        .await
                        .map_err(|e| through(host, r, e))?;
                    handshake(host, r, channel.into_stream(), opts, Some(via)).await
                }
            }
        };
        let (session, ended) =
            tokio::time::timeout(timeout, attempt)
                .await
                .map_err(|_| RemoteError::Timeout {
                    host: host.to_string(),
                    target: name,
                    after: timeout,
                })??;
        Ok((Arc::new(session), ended))
    })
}

/// The shared connection to jump host `j`, dialed if there is none alive.
async fn jump(j: &Resolved, opts: &ConnectOptions) -> Result<Arc<Session>, RemoteError> {
    let slot = JUMPS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(j.identity())
        .or_default()
        .clone();
    // Held while dialing, so hosts behind the same jump host that connect at once share one.
    let mut cached = slot.lock().await;
    if let Some(session) = cached.upgrade().filter(|s| !s.is_closed()) {
        return Ok(session);
    }
    let (session, _ended) = dial(&j.alias, j, opts).await?;
    tracing::debug!("ssh: jump connection to {} ({})", j.alias, session.label);
    *cached = Arc::downgrade(&session);
    Ok(session)
}

async fn open_channel(
    via: &Session,
    r: &Resolved,
) -> Result<russh::Channel<russh::client::Msg>, RemoteError> {
    let jump_alias = r.jump.as_ref().map_or("", |j| j.alias.as_str()).to_string();
    via.handle
        .channel_open_direct_tcpip(r.hostname.as_str(), u32::from(r.port), "127.0.0.1", 0)
        .await
        .map_err(|e| RemoteError::Tunnel {
            host: jump_alias,
            to: format!("{}:{}", r.hostname, r.port),
            reason: match e {
                russh::Error::ChannelOpenFailure(why) => channel_refusal(&why),
                other => other.to_string(),
            },
        })
}

/// What a jump host's refusal to open a direct-tcpip channel means, in sshd's terms.
fn channel_refusal(why: &ChannelOpenFailure) -> String {
    match why {
        ChannelOpenFailure::AdministrativelyProhibited => {
            "refused by the jump host (AllowTcpForwarding or PermitOpen in its sshd_config)".into()
        }
        ChannelOpenFailure::ConnectFailed => {
            "the jump host could not connect there (down, or a wrong HostName/Port)".into()
        }
        ChannelOpenFailure::ResourceShortage => "the jump host is out of sessions".into(),
        ChannelOpenFailure::UnknownChannelType => "the jump host does not forward TCP".into(),
        ChannelOpenFailure::Other { code, reason } => format!("refused ({code}): {reason}"),
    }
}

/// A failure on the way to `r` (at a jump host, or opening the channel from the last one),
/// said once for the whole chain and naming the hop that failed.
fn through(host: &str, r: &Resolved, e: RemoteError) -> RemoteError {
    let source = match e {
        RemoteError::Jump { source, .. } => source,
        other => Box::new(other),
    };
    RemoteError::Jump {
        host: host.to_string(),
        target: r.alias.clone(),
        via: r.hops().join(", "),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_say_what_to_check_on_the_jump_host() {
        assert!(
            channel_refusal(&ChannelOpenFailure::AdministrativelyProhibited)
                .contains("AllowTcpForwarding")
        );
        assert!(channel_refusal(&ChannelOpenFailure::ConnectFailed).contains("HostName/Port"));
    }

    #[test]
    fn a_failure_deep_in_the_chain_is_named_once_for_the_whole_chain() {
        let hop = |alias: &str, jump: Option<Resolved>| Resolved {
            alias: alias.into(),
            hostname: format!("{alias}.lab"),
            port: 22,
            user: "u".into(),
            identity_files: vec![],
            identities_only: false,
            known_hosts: "/kh".into(),
            connect_timeout: None,
            keepalive: crate::remote::ssh_config::DEFAULT_KEEPALIVE,
            jump: jump.map(Box::new),
        };
        let pve = hop("pve", Some(hop("inner", Some(hop("outer", None)))));
        let deep = RemoteError::Unreachable {
            host: "outer".into(),
            target: "outer.lab".into(),
            source: std::io::ErrorKind::ConnectionRefused.into(),
        };
        let inner = through("inner", pve.jump.as_deref().unwrap(), deep);
        let err = through("ct200", &pve, inner).to_string();
        assert!(
            err.starts_with(
                "ct200: cannot reach pve through outer, inner: outer: cannot connect to outer.lab"
            ),
            "{err}"
        );
    }
}
