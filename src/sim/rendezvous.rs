//! SGLang's multi-node start (`--nnodes N --node-rank R --dist-init-addr HOST:PORT`): every node
//! runs the same command; rank 0 hosts torch.distributed's store on HOST:PORT and the others
//! connect to it. Only rank 0 serves the API, once every rank has joined and loaded; a rank
//! ≥ 1 serves a dummy `/health` (`launch_dummy_health_check_server` in
//! `srt/utils/common.py`, started by `srt/entrypoints/engine.py` once its schedulers are ready).
//! A rank lost is the server lost: the collectives of the others fail.
//!
//! The sim's store is one TCP connection per rank ≥ 1, line by line: the rank says
//! `rank R of N`, rank 0 answers `go` once all N − 1 have joined, each rank says `loaded` after
//! its load, and rank 0 says `shutdown` when it stops gracefully (SGLang's `ShutdownReq`
//! broadcast). A connection that closes otherwise is a lost rank, on either side. Everything
//! waits on the connections themselves; only a rank ≥ 1 whose connect is refused retries.

use std::net::SocketAddr;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::sim::log;

/// torch.distributed's default timeout of a NCCL process group, which the store's connect and
/// wait use when `--dist-timeout` is not given (`srt/distributed/parallel_state.py` passes it).
pub const DEFAULT_TIMEOUT_SECS: f64 = 600.0;

/// Why the start stopped at the rendezvous.
#[derive(Debug, thiserror::Error)]
pub enum RendezvousError {
    #[error("interrupted")]
    Interrupted,
    /// What torch raises, with the exception's class: logged as the traceback's last line.
    #[error("{0}")]
    Failed(String),
}

/// How a rank's part in the group ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// This rank stopped (a signal), or rank 0 broadcast its shutdown.
    Stopped,
    /// Another rank's connection closed: the exception the collectives raise.
    Lost(String),
}

/// This rank's side of the group.
pub enum Group {
    /// `--nnodes 1`: nothing to join.
    Alone,
    Leader(Leader),
    Follower(Follower),
}

pub struct Leader {
    /// How many ranks ≥ 1 have loaded.
    loaded: watch::Receiver<usize>,
    others: usize,
    watcher: JoinHandle<End>,
}

pub struct Follower {
    writer: OwnedWriteHalf,
    watcher: JoinHandle<End>,
}

/// The rendezvous address: `HOST:PORT` (`NetworkAddress.parse` takes the last colon).
fn split_addr(addr: &str) -> Result<(String, u16), RendezvousError> {
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| {
        RendezvousError::Failed(format!(
            "ValueError: invalid --dist-init-addr '{addr}': expected HOST:PORT"
        ))
    })?;
    let port = port.parse().map_err(|_| {
        RendezvousError::Failed(format!(
            "ValueError: invalid port in --dist-init-addr '{addr}'"
        ))
    })?;
    Ok((host.trim_matches(['[', ']']).to_string(), port))
}

/// Joins the group of `nnodes` ranks from this node's `--host`; `timeout` is in wall seconds.
pub async fn join(
    nnodes: u64,
    node_rank: u64,
    local_host: &str,
    addr: Option<&str>,
    timeout: Duration,
    cancel: &CancellationToken,
) -> Result<Group, RendezvousError> {
    if nnodes <= 1 {
        return Ok(Group::Alone);
    }
    // Without --dist-init-addr each node would use its own host and a port of its own
    // (`_resolve_dist_init_method` in srt/distributed/bootstrap.py): the ranks never meet.
    let addr = addr.unwrap_or("127.0.0.1:0");
    let (host, port) = split_addr(addr)?;
    if node_rank == 0 {
        lead(nnodes, &host, port, timeout, cancel).await
    } else {
        follow(
            nnodes,
            node_rank,
            local_host,
            (&host, port),
            timeout,
            cancel,
        )
        .await
    }
}

async fn lead(
    nnodes: u64,
    host: &str,
    port: u16,
    timeout: Duration,
    cancel: &CancellationToken,
) -> Result<Group, RendezvousError> {
    let listener = TcpListener::bind((host, port)).await.map_err(|e| {
        RendezvousError::Failed(format!(
            "torch.distributed.DistNetworkError: The server socket has failed to listen on any \
             local network address. port: {port}, useIpv6: 0, code: -{}, name: {}, message: {e}",
            e.raw_os_error().unwrap_or(0),
            errno_name(&e)
        ))
    })?;
    let others = (nnodes - 1) as usize;
    let mut peers: Vec<(
        u64,
        SocketAddr,
        Lines<BufReader<OwnedReadHalf>>,
        OwnedWriteHalf,
    )> = Vec::new();
    // Connections still to say which rank they are: read side by side, so a stray connection
    // (a port probe) that never speaks holds no rank up.
    let mut hellos = FuturesUnordered::new();
    let deadline = tokio::time::Instant::now() + timeout;
    while peers.len() < others {
        tokio::select! {
            _ = cancel.cancelled() => return Err(RendezvousError::Interrupted),
            _ = tokio::time::sleep_until(deadline) => {
                return Err(RendezvousError::Failed(format!(
                    "torch.distributed.DistStoreError: Timed out after {} seconds waiting for \
                     clients. {}/{nnodes} clients joined.",
                    timeout.as_secs() + 1,
                    peers.len() + 1
                )));
            }
            r = listener.accept() => {
                if let Ok((stream, peer)) = r {
                    let (read, write) = stream.into_split();
                    let mut lines = BufReader::new(read).lines();
                    hellos.push(async move {
                        let hello = lines.next_line().await;
                        (hello, peer, lines, write)
                    });
                }
            }
            Some((hello, peer, lines, write)) = hellos.next() => {
                let rank = hello
                    .ok()
                    .flatten()
                    .and_then(|l| l.strip_prefix("rank ")?.split(' ').next()?.parse::<u64>().ok())
                    .filter(|r| *r >= 1 && *r < nnodes && !peers.iter().any(|p| p.0 == *r));
                if let Some(rank) = rank {
                    peers.push((rank, peer, lines, write));
                }
            }
        }
    }
    let mut readers = Vec::new();
    let mut writers = Vec::new();
    for (rank, peer, lines, mut write) in peers {
        if write.write_all(b"go\n").await.is_err() {
            return Err(RendezvousError::Failed(closed_by_peer(peer)));
        }
        readers.push((rank, peer, lines));
        writers.push(write);
    }
    let (loaded_tx, loaded) = watch::channel(0usize);
    let watcher = tokio::spawn(watch_followers(readers, writers, loaded_tx, cancel.clone()));
    Ok(Group::Leader(Leader {
        loaded,
        others,
        watcher,
    }))
}

/// Rank 0's watch over the others: counts their `loaded`, ends the server when one goes away,
/// and broadcasts `shutdown` when this server stops.
async fn watch_followers(
    readers: Vec<(u64, SocketAddr, Lines<BufReader<OwnedReadHalf>>)>,
    mut writers: Vec<OwnedWriteHalf>,
    loaded: watch::Sender<usize>,
    cancel: CancellationToken,
) -> End {
    let loaded = &loaded;
    let mut peers: FuturesUnordered<_> = readers
        .into_iter()
        .map(|(_, peer, mut lines)| async move {
            loop {
                match lines.next_line().await {
                    Ok(Some(l)) if l == "loaded" => loaded.send_modify(|n| *n += 1),
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => return peer,
                }
            }
        })
        .collect();
    tokio::select! {
        _ = cancel.cancelled() => {
            for w in &mut writers {
                // A rank already gone needs no shutdown.
                let _ = w.write_all(b"shutdown\n").await;
                let _ = w.shutdown().await;
            }
            End::Stopped
        }
        Some(peer) = peers.next() => {
            cancel.cancel();
            End::Lost(closed_by_peer(peer))
        }
    }
}

async fn follow(
    nnodes: u64,
    rank: u64,
    local_host: &str,
    (host, port): (&str, u16),
    timeout: Duration,
    cancel: &CancellationToken,
) -> Result<Group, RendezvousError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let timed_out = || {
        RendezvousError::Failed(format!(
            "torch.distributed.DistNetworkError: The client socket has timed out after {}ms \
             while trying to connect to ({host}, {port}).",
            timeout.as_millis()
        ))
    };
    let mut backoff = Duration::from_millis(20);
    let mut warned = false;
    let stream = loop {
        let attempt = tokio::select! {
            _ = cancel.cancelled() => return Err(RendezvousError::Interrupted),
            _ = tokio::time::sleep_until(deadline) => return Err(timed_out()),
            r = connect(local_host, host, port) => r,
        };
        match attempt {
            Ok(s) => break s,
            Err(e) => {
                if !warned {
                    // torch's c10d socket.cpp warns once, then retries with backoff.
                    log::server(&format!(
                        "[W socket.cpp:755] [c10d] The client socket has failed to connect to \
                         [{host}]:{port} (errno: {} - {e}).",
                        e.raw_os_error().unwrap_or(0)
                    ));
                    warned = true;
                }
                // Retrying a refused connect: the store is not up yet. Not a synchronisation:
                // the connect itself says when it is.
                tokio::select! {
                    _ = cancel.cancelled() => return Err(RendezvousError::Interrupted),
                    _ = tokio::time::sleep_until(deadline) => return Err(timed_out()),
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_millis(500));
            }
        }
    };
    let leader = stream.peer_addr().map_err(|_| timed_out())?;
    let (read, mut writer) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    if writer
        .write_all(format!("rank {rank} of {nnodes}\n").as_bytes())
        .await
        .is_err()
    {
        return Err(RendezvousError::Failed(closed_by_peer(leader)));
    }
    let go = tokio::select! {
        _ = cancel.cancelled() => return Err(RendezvousError::Interrupted),
        _ = tokio::time::sleep_until(deadline) => return Err(timed_out()),
        l = lines.next_line() => l,
    };
    if !matches!(go, Ok(Some(ref l)) if l == "go") {
        return Err(RendezvousError::Failed(closed_by_peer(leader)));
    }
    let watcher = tokio::spawn(watch_leader(lines, leader, cancel.clone()));
    Ok(Group::Follower(Follower { writer, watcher }))
}

/// Connects from this node's own address (as gloo binds to its host's interface), so rank 0
/// sees the rank at its node's address.
async fn connect(local_host: &str, host: &str, port: u16) -> std::io::Result<TcpStream> {
    let remote = tokio::net::lookup_host((host, port))
        .await?
        .next()
        .ok_or_else(|| std::io::Error::other(format!("no address for {host}")))?;
    let socket = if remote.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    if let Ok(Some(local)) = tokio::net::lookup_host((local_host, 0))
        .await
        .map(|mut a| a.find(|a| a.is_ipv4() == remote.is_ipv4()))
    {
        // A host that is not this machine's (a typo) only loses the source address.
        let _ = socket.bind(local);
    }
    socket.connect(remote).await
}

/// A rank ≥ 1's watch over rank 0: its `shutdown` stops this rank, its loss ends it.
async fn watch_leader(
    mut lines: Lines<BufReader<OwnedReadHalf>>,
    leader: SocketAddr,
    cancel: CancellationToken,
) -> End {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return End::Stopped,
            l = lines.next_line() => match l {
                Ok(Some(l)) if l == "shutdown" => {
                    cancel.cancel();
                    return End::Stopped;
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => {
                    cancel.cancel();
                    return End::Lost(closed_by_peer(leader));
                }
            },
        }
    }
}

/// What gloo raises when the other end of a pair goes away.
fn closed_by_peer(peer: SocketAddr) -> String {
    format!(
        "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection \
         closed by peer [{}]:{}",
        peer.ip(),
        peer.port()
    )
}

fn errno_name(e: &std::io::Error) -> &'static str {
    match e.kind() {
        std::io::ErrorKind::AddrInUse => "EADDRINUSE",
        std::io::ErrorKind::AddrNotAvailable => "EADDRNOTAVAIL",
        std::io::ErrorKind::PermissionDenied => "EACCES",
        _ => "EIO",
    }
}

impl Group {
    /// Rank 0 waits for every other rank's load before it opens the API; a rank lost
    /// meanwhile cancels `cancel` (and this returns).
    pub async fn all_loaded(&mut self, cancel: &CancellationToken) {
        if let Group::Leader(l) = self {
            let others = l.others;
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = l.loaded.wait_for(|n| *n >= others) => {}
            }
        }
    }

    /// A rank ≥ 1 tells rank 0 its load is done.
    pub async fn loaded(&mut self) {
        if let Group::Follower(f) = self {
            // A rank 0 already gone shows as the watcher's loss.
            let _ = f.writer.write_all(b"loaded\n").await;
        }
    }

    /// Ends this rank's part (call after `cancel` fired): joins the watcher and tells whether
    /// another rank was lost.
    pub async fn end(self) -> End {
        let watcher = match self {
            Group::Alone => return End::Stopped,
            Group::Leader(l) => l.watcher,
            Group::Follower(f) => {
                drop(f.writer);
                f.watcher
            }
        };
        watcher.await.unwrap_or(End::Stopped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn free_addr() -> String {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap().to_string()
    }

    #[tokio::test]
    async fn three_ranks_join_load_and_rank_0_shuts_them_down() {
        let addr = free_addr().await;
        let t = Duration::from_secs(10);
        let (c0, c1, c2) = (
            CancellationToken::new(),
            CancellationToken::new(),
            CancellationToken::new(),
        );
        let (g0, g1, g2) = tokio::join!(
            join(3, 0, "127.0.0.1", Some(&addr), t, &c0),
            join(3, 1, "127.0.0.1", Some(&addr), t, &c1),
            join(3, 2, "127.0.0.1", Some(&addr), t, &c2),
        );
        let (mut g0, mut g1, mut g2) = (g0.unwrap(), g1.unwrap(), g2.unwrap());
        g1.loaded().await;
        g2.loaded().await;
        g0.all_loaded(&c0).await;
        assert!(!c0.is_cancelled());
        c0.cancel();
        assert_eq!(g0.end().await, End::Stopped);
        c1.cancelled().await;
        c2.cancelled().await;
        assert_eq!(g1.end().await, End::Stopped);
        assert_eq!(g2.end().await, End::Stopped);
    }

    #[tokio::test]
    async fn a_lost_rank_ends_rank_0() {
        let addr = free_addr().await;
        let t = Duration::from_secs(10);
        let (c0, c1) = (CancellationToken::new(), CancellationToken::new());
        let (g0, g1) = tokio::join!(
            join(2, 0, "127.0.0.1", Some(&addr), t, &c0),
            join(2, 1, "127.0.0.1", Some(&addr), t, &c1)
        );
        let (g0, g1) = (g0.unwrap(), g1.unwrap());
        c1.cancel();
        assert_eq!(g1.end().await, End::Stopped);
        c0.cancelled().await;
        match g0.end().await {
            End::Lost(e) => assert!(e.contains("Connection closed by peer [127.0.0.1]"), "{e}"),
            End::Stopped => panic!("rank 0 must see rank 1 lost"),
        }
    }

    #[tokio::test]
    async fn rank_1_times_out_where_nobody_listens_and_rank_0_where_nobody_comes() {
        let addr = free_addr().await;
        let c = CancellationToken::new();
        let err = match join(
            2,
            1,
            "127.0.0.1",
            Some(&addr),
            Duration::from_millis(200),
            &c,
        )
        .await
        {
            Err(RendezvousError::Failed(e)) => e,
            _ => panic!("expected a timeout"),
        };
        assert!(
            err.starts_with(
                "torch.distributed.DistNetworkError: The client socket has timed out after 200ms"
            ),
            "{err}"
        );
        let err = match join(
            2,
            0,
            "127.0.0.1",
            Some(&addr),
            Duration::from_millis(200),
            &c,
        )
        .await
        {
            Err(RendezvousError::Failed(e)) => e,
            _ => panic!("expected a timeout"),
        };
        assert!(
            err.ends_with("waiting for clients. 1/2 clients joined."),
            "{err}"
        );
    }
}
