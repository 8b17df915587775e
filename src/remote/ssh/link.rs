//! Keeping one host's connection: noticing that it ended (EOF, an error, missed keepalives),
//! redialing with capped jittered backoff under the same rules as the first connection, and
//! publishing the state as a [`Link`]. Generic over what is dialed, so the decisions run on
//! tokio's paused clock in the tests below.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::super::{Link, LinkLoss, RemoteError};
use crate::backoff::Backoff;

/// Waits before redial n: 250 ms doubling to 5 s, so a host back from a reboot is in use again
/// within about 5 s of answering.
pub(super) const RECONNECT: Backoff =
    Backoff::new(Duration::from_millis(250), Duration::from_secs(5));

/// A connection and what tells when (and why) it ended.
pub(super) struct Dialed<C> {
    pub conn: Arc<C>,
    pub ended: BoxFuture<'static, LinkLoss>,
}

pub(super) trait Dial: Send + Sync + 'static {
    type Conn: Send + Sync + 'static;
    fn dial(&self) -> BoxFuture<'_, Result<Dialed<Self::Conn>, RemoteError>>;
}

/// The connection in use (none while down) together with the link it belongs to.
struct State<C> {
    conn: Option<Arc<C>>,
    link: Link,
}

impl<C> Clone for State<C> {
    fn clone(&self) -> Self {
        State {
            conn: self.conn.clone(),
            link: self.link.clone(),
        }
    }
}

/// What users of a connection read; the supervisor writes it.
pub(super) struct Keeper<C> {
    state: watch::Sender<State<C>>,
    /// The same link, on its own channel, for [`crate::remote::Transport::link`].
    link: watch::Sender<Link>,
}

impl<C> Keeper<C> {
    pub fn new(conn: Arc<C>) -> Self {
        let up = Link::Up { generation: 0 };
        Keeper {
            state: watch::Sender::new(State {
                conn: Some(conn),
                link: up.clone(),
            }),
            link: watch::Sender::new(up),
        }
    }

    /// The connection now, or `None` while the link is not up.
    pub fn current(&self) -> Option<Arc<C>> {
        self.state.borrow().conn.clone()
    }

    pub fn link(&self) -> watch::Receiver<Link> {
        self.link.subscribe()
    }

    /// The connection, waiting up to `bound` for it to come back; else the link as it stands.
    pub async fn wait_up(&self, bound: Duration) -> Result<Arc<C>, Link> {
        let mut rx = self.state.subscribe();
        let settled = rx.wait_for(|s| s.conn.is_some() || matches!(s.link, Link::Failed { .. }));
        if let Ok(Ok(state)) = tokio::time::timeout(bound, settled).await
            && let Some(conn) = &state.conn
        {
            return Ok(conn.clone());
        }
        Err(self.state.borrow().link.clone())
    }

    fn set(&self, conn: Option<Arc<C>>, link: Link) {
        self.state.send_replace(State {
            conn,
            link: link.clone(),
        });
        self.link.send_replace(link);
    }
}

/// Whether redialing could help: a refused host key, refused authentication or a bad
/// configuration will be refused again, and retrying them for days helps no one.
pub(super) fn retryable(e: &RemoteError) -> bool {
    match e {
        RemoteError::Jump { source, .. } => retryable(source),
        RemoteError::UnknownHostKey { .. }
        | RemoteError::HostKeyChanged { .. }
        | RemoteError::AuthRefused { .. }
        | RemoteError::Config { .. }
        | RemoteError::KnownHosts { .. } => false,
        _ => true,
    }
}

/// Watches `first` until it ends, then redials until it is back, for as long as it is not
/// cancelled. `host` and `target` name it in the one warning when lost and one info when back.
pub(super) async fn supervise<D: Dial>(
    dialer: D,
    first: BoxFuture<'static, LinkLoss>,
    keeper: Arc<Keeper<D::Conn>>,
    backoff: Backoff,
    host: String,
    target: String,
    cancel: CancellationToken,
) {
    let mut ended = first;
    let mut generation = 0;
    loop {
        let reason = tokio::select! {
            _ = cancel.cancelled() => return,
            reason = &mut ended => reason,
        };
        let since = Instant::now();
        tracing::warn!(host = %host, "{host}: lost the SSH connection to {target} ({reason}); reconnecting");
        keeper.set(None, Link::Down { since, reason });
        let mut attempt = 0u32;
        let dialed = loop {
            attempt += 1;
            let result = tokio::select! {
                _ = cancel.cancelled() => return,
                result = dialer.dial() => result,
            };
            match result {
                Ok(dialed) => break dialed,
                Err(e) if !retryable(&e) => {
                    tracing::warn!(host = %host, "{host}: not reconnecting to {target}: {e}");
                    keeper.set(
                        None,
                        Link::Failed {
                            since,
                            error: Arc::new(e),
                        },
                    );
                    return;
                }
                Err(e) => {
                    let wait = backoff.random_delay(attempt);
                    tracing::debug!(host = %host, "reconnect attempt {attempt} to {target} failed ({e}); next in {wait:?}");
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
            }
        };
        generation += 1;
        tracing::info!(
            host = %host,
            "{host}: reconnected to {target} after {:.1?} ({attempt} attempt{})",
            since.elapsed(),
            if attempt == 1 { "" } else { "s" }
        );
        keeper.set(Some(dialed.conn), Link::Up { generation });
        ended = dialed.ended;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;

    use tokio::sync::oneshot;

    use super::*;

    /// Answers dials from a script; each success hands out a connection the test can end.
    struct Script {
        outcomes: Mutex<VecDeque<Result<u32, RemoteError>>>,
        enders: Mutex<Vec<oneshot::Sender<LinkLoss>>>,
        dials: Mutex<Vec<Instant>>,
    }

    impl Script {
        fn new(outcomes: Vec<Result<u32, RemoteError>>) -> Arc<Self> {
            Arc::new(Script {
                outcomes: Mutex::new(outcomes.into()),
                enders: Mutex::new(Vec::new()),
                dials: Mutex::new(Vec::new()),
            })
        }
        fn end_latest(&self, loss: LinkLoss) {
            let tx = self
                .enders
                .lock()
                .unwrap()
                .pop()
                .expect("a live connection");
            tx.send(loss).unwrap();
        }
        fn dial_times(&self) -> Vec<Instant> {
            self.dials.lock().unwrap().clone()
        }
    }

    impl Dial for Arc<Script> {
        type Conn = u32;
        fn dial(&self) -> BoxFuture<'_, Result<Dialed<u32>, RemoteError>> {
            Box::pin(async move {
                self.dials.lock().unwrap().push(Instant::now());
                // A dial takes time, like a handshake.
                tokio::time::sleep(Duration::from_millis(10)).await;
                let next = self.outcomes.lock().unwrap().pop_front();
                let id = next.expect("an outcome for every dial")?;
                let (tx, rx) = oneshot::channel();
                self.enders.lock().unwrap().push(tx);
                Ok(Dialed {
                    conn: Arc::new(id),
                    ended: Box::pin(async move { rx.await.unwrap_or(LinkLoss::Ended) }),
                })
            })
        }
    }

    fn refused() -> RemoteError {
        RemoteError::Unreachable {
            host: "h".into(),
            target: "t".into(),
            source: std::io::ErrorKind::ConnectionRefused.into(),
        }
    }

    fn key_changed() -> RemoteError {
        RemoteError::HostKeyChanged {
            host: "h".into(),
            target: "t".into(),
            fingerprint: "SHA256:x".into(),
            known_hosts: "/kh".into(),
            line: 1,
        }
    }

    /// A supervised first connection (id 0) and the script for what follows.
    fn start(
        outcomes: Vec<Result<u32, RemoteError>>,
        backoff: Backoff,
    ) -> (
        Arc<Script>,
        Arc<Keeper<u32>>,
        CancellationToken,
        tokio::task::JoinHandle<()>,
    ) {
        let script = Script::new(outcomes);
        let (tx, rx) = oneshot::channel();
        script.enders.lock().unwrap().push(tx);
        let keeper = Arc::new(Keeper::new(Arc::new(0)));
        let cancel = CancellationToken::new();
        let task = tokio::spawn(supervise(
            script.clone(),
            Box::pin(async move { rx.await.unwrap_or(LinkLoss::Ended) }),
            keeper.clone(),
            backoff,
            "h".into(),
            "u@t".into(),
            cancel.clone(),
        ));
        (script, keeper, cancel, task)
    }

    async fn until(keeper: &Keeper<u32>, what: impl Fn(&Link) -> bool) -> Link {
        let mut rx = keeper.link();
        rx.wait_for(|l| what(l)).await.unwrap().clone()
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_connection_is_redialed_with_capped_backoff_until_it_is_back() {
        let no_jitter = RECONNECT.with_jitter(0.0);
        let mut outcomes: Vec<_> = (0..7).map(|_| Err(refused())).collect();
        outcomes.push(Ok(1));
        let (script, keeper, cancel, task) = start(outcomes, no_jitter);
        assert_eq!(*keeper.current().unwrap(), 0);
        let lost_at = Instant::now();
        script.end_latest(LinkLoss::Keepalive {
            interval: Duration::from_secs(15),
            max: 3,
        });
        let down = until(&keeper, |l| matches!(l, Link::Down { .. })).await;
        assert!(
            matches!(
                &down,
                Link::Down {
                    reason: LinkLoss::Keepalive { max: 3, .. },
                    ..
                }
            ),
            "{down:?}"
        );
        assert!(keeper.current().is_none());
        let up = until(&keeper, Link::is_up).await;
        assert!(matches!(up, Link::Up { generation: 1 }), "{up:?}");
        assert_eq!(*keeper.current().unwrap(), 1);
        // The first redial is at once; then 250 ms doubling, capped at 5 s (each dial 10 ms).
        let gaps: Vec<u128> = script
            .dial_times()
            .windows(2)
            .map(|w| (w[1] - w[0]).as_millis())
            .collect();
        assert_eq!(gaps, [260, 510, 1010, 2010, 4010, 5010, 5010]);
        assert_eq!((script.dial_times()[0] - lost_at).as_millis(), 0);
        cancel.cancel();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn every_reconnect_is_a_new_generation() {
        let (script, keeper, cancel, task) = start(vec![Ok(1), Ok(2)], RECONNECT);
        for generation in 1..=2 {
            script.end_latest(LinkLoss::Ended);
            let up = until(
                &keeper,
                |l| matches!(l, Link::Up { generation: g } if *g == generation),
            )
            .await;
            assert!(up.is_up());
            assert_eq!(*keeper.current().unwrap(), generation as u32);
        }
        cancel.cancel();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_that_retrying_cannot_fix_ends_reconnecting() {
        let (script, keeper, _cancel, task) =
            start(vec![Err(refused()), Err(key_changed())], RECONNECT);
        script.end_latest(LinkLoss::Ended);
        let failed = until(&keeper, |l| matches!(l, Link::Failed { .. })).await;
        let Link::Failed { error, .. } = failed else {
            unreachable!()
        };
        assert!(matches!(*error, RemoteError::HostKeyChanged { .. }));
        // The supervisor is done: no more dials, and waiting callers learn it at once.
        task.await.unwrap();
        assert_eq!(script.dial_times().len(), 2);
        let start = Instant::now();
        let err = keeper.wait_up(Duration::from_secs(60)).await.unwrap_err();
        assert!(matches!(err, Link::Failed { .. }));
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_callers_get_the_connection_back_or_give_up_at_their_bound() {
        let mut outcomes: Vec<_> = (0..3).map(|_| Err(refused())).collect();
        outcomes.push(Ok(1));
        let (script, keeper, cancel, task) = start(outcomes, RECONNECT.with_jitter(0.0));
        script.end_latest(LinkLoss::Ended);
        until(&keeper, |l| matches!(l, Link::Down { .. })).await;
        // Back after 10 + 260 + 510 + 1010 ms: a caller waiting 100 ms gives up...
        let start = Instant::now();
        let down = keeper
            .wait_up(Duration::from_millis(100))
            .await
            .unwrap_err();
        assert!(
            matches!(
                down,
                Link::Down {
                    reason: LinkLoss::Ended,
                    ..
                }
            ),
            "{down:?}"
        );
        assert_eq!(start.elapsed(), Duration::from_millis(100));
        // ...one waiting 10 s gets the new connection as soon as it is up.
        let conn = keeper.wait_up(Duration::from_secs(10)).await.unwrap();
        assert_eq!(*conn, 1);
        assert_eq!(start.elapsed(), Duration::from_millis(1790));
        cancel.cancel();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn cancelling_stops_the_supervisor_while_up_down_or_backing_off() {
        let (_script, _keeper, cancel, task) = start(vec![], RECONNECT);
        cancel.cancel();
        task.await.unwrap();
        let outcomes: Vec<_> = (0..50).map(|_| Err(refused())).collect();
        let (script, keeper, cancel, task) = start(outcomes, RECONNECT);
        script.end_latest(LinkLoss::Ended);
        until(&keeper, |l| matches!(l, Link::Down { .. })).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        cancel.cancel();
        task.await.unwrap();
        assert!(matches!(*keeper.link().borrow(), Link::Down { .. }));
    }

    #[test]
    fn only_refusals_by_policy_stop_reconnecting() {
        assert!(retryable(&refused()));
        assert!(!retryable(&key_changed()));
        let deep = RemoteError::Jump {
            host: "h".into(),
            target: "pve".into(),
            via: "bastion".into(),
            source: Box::new(key_changed()),
        };
        assert!(!retryable(&deep));
        assert!(retryable(&RemoteError::Timeout {
            host: "h".into(),
            target: "t".into(),
            after: Duration::from_secs(10),
        }));
    }
}
