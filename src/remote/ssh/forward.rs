//! Local port forwarding (`ssh -L`): a listener on 127.0.0.1 whose every connection gets its own
//! direct-tcpip channel on the host's connection as it is at that moment. The listener outlives
//! reconnects, so a forwarded address stays valid; while the link is down a new connection is
//! reset at once, so an HTTP client fails fast instead of hanging.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::hop::Session;
use super::link::Keeper;

#[derive(Clone)]
pub(super) struct Destination {
    pub host: String,
    pub addr: String,
    pub port: u16,
}

/// Accepts local connections until cancelled; each gets its own direct-tcpip channel.
pub(super) async fn serve(
    listener: TcpListener,
    keeper: Arc<Keeper<Session>>,
    dest: Destination,
    cancel: CancellationToken,
) {
    let mut pipes = JoinSet::new();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => match keeper.current().filter(|s| !s.is_closed()) {
                    Some(session) => {
                        pipes.spawn(pipe(tcp, peer, session, dest.clone(), cancel.clone()));
                    }
                    None => reset(tcp),
                },
                Err(e) => {
                    // Usually out of file descriptors: back off instead of spinning.
                    tracing::warn!(host = %dest.host, "forward to {}:{}: accept failed: {e}", dest.addr, dest.port);
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                    }
                }
            },
            Some(_) = pipes.join_next(), if !pipes.is_empty() => {}
        }
    }
    drop(listener);
    while pipes.join_next().await.is_some() {}
}

/// Closes with a reset rather than a FIN: the client sees "connection reset" at once instead of
/// an empty answer it might wait on or retry as if the server had spoken.
fn reset(tcp: TcpStream) {
    let _ = tcp.set_zero_linger();
    drop(tcp);
}

async fn pipe(
    mut tcp: TcpStream,
    peer: SocketAddr,
    session: Arc<Session>,
    dest: Destination,
    cancel: CancellationToken,
) {
    let _ = tcp.set_nodelay(true);
    let open = session.handle.channel_open_direct_tcpip(
        dest.addr.as_str(),
        u32::from(dest.port),
        peer.ip().to_string(),
        u32::from(peer.port()),
    );
    let channel = tokio::select! {
        _ = cancel.cancelled() => return,
        opened = open => match opened {
            Ok(channel) => channel,
            Err(e) => {
                // Usually nothing listens there yet (SGLang opens its port only after the model
                // has loaded): the caller sees the reset and decides what it means.
                if !session.is_closed() {
                    tracing::trace!(host = %dest.host, "forward to {}:{}: the server refused the channel: {e}", dest.addr, dest.port);
                }
                reset(tcp);
                return;
            }
        },
    };
    // `session` stays held: this channel runs on it even after a reconnect has replaced it
    // for new connections (then this one ends with the old link).
    let mut remote = channel.into_stream();
    tokio::select! {
        _ = cancel.cancelled() => {}
        copied = tokio::io::copy_bidirectional(&mut tcp, &mut remote) => {
            if let Err(e) = copied {
                tracing::debug!(host = %dest.host, "forward to {}:{} ended: {e}", dest.addr, dest.port);
            }
        }
    }
    // A link lost mid-request ends the channel like a clean close would; the client must not
    // take the cut for the end of a complete answer.
    if session.is_closed() {
        reset(tcp);
    }
}
