//! The SSH transport riding out a dropped connection, through the library against real sshd:
//! the process serving the connection killed mid-use, the server gone for seconds and back on
//! the same port with the same host key, a host that hangs (found by keepalives), and one that
//! comes back with another host key (refused, for good).

mod common;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Sshd, keygen};
use fleet::config::MachineSpec;
use fleet::remote::{self, ConnectOptions, Link, LinkLoss, RemoteError, Transport};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

fn argv(words: &[&str]) -> Vec<String> {
    words.iter().map(|s| s.to_string()).collect()
}

async fn connect(spec: &MachineSpec, opts: &ConnectOptions) -> Arc<dyn Transport> {
    match remote::connect(spec, opts).await {
        Ok(t) => t,
        Err(e) => panic!("connect {}: {e}", spec.name),
    }
}

/// Fails the test instead of hanging it.
async fn within<T>(what: &str, limit: Duration, f: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, f).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: not within {limit:?}"),
    }
}

async fn link_until(
    rx: &mut watch::Receiver<Link>,
    what: &str,
    cond: impl Fn(&Link) -> bool,
) -> Link {
    within(what, Duration::from_secs(30), rx.wait_for(|l| cond(l)))
        .await
        .expect("the transport is alive")
        .clone()
}

/// An echo server on 127.0.0.1 that the test owns.
async fn echo_server() -> (u16, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let mut conns = tokio::task::JoinSet::new();
        while let Ok((mut s, _)) = listener.accept().await {
            conns.spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    (port, task)
}

async fn roundtrip(addr: SocketAddr, payload: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(payload).await?;
    s.shutdown().await?;
    let mut back = Vec::new();
    s.read_to_end(&mut back).await?;
    Ok(back)
}

/// Collects what fleet logs on this thread (the current-thread test runtime runs every task
/// here).
#[derive(Clone, Default)]
struct LogBuffer(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl LogBuffer {
    fn install(&self) -> tracing::subscriber::DefaultGuard {
        self.install_at("fleet=info")
    }
    /// With `filter` (`fleet=debug` to see each reconnect attempt).
    fn install_at(&self, filter: &str) -> tracing::subscriber::DefaultGuard {
        let writer = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::set_default(subscriber)
    }
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

fn logins(sshd: &Sshd) -> usize {
    sshd.log().matches("Accepted publickey").count()
}

#[tokio::test]
async fn a_killed_session_is_reconnected_and_the_forward_keeps_its_port() {
    let logs = LogBuffer::default();
    let _guard = logs.install();
    let sshd = Sshd::start();
    let kh = sshd.known_hosts_file("kh", &[sshd.known_hosts_line()]);
    let t = connect(
        &sshd.host_spec("gpu1", None, &kh),
        &ConnectOptions::default(),
    )
    .await;
    let mut link = t.link();
    assert!(matches!(*link.borrow(), Link::Up { generation: 0 }));
    let (port, echo) = echo_server().await;
    let tunnel = t.forward("127.0.0.1", port).await.unwrap();
    let local = tunnel.local_addr();

    // A long-lived sequence of commands and forwarded requests, as a job makes them; the
    // connection is killed under it. Every step must either work or fail promptly, never hang
    // or answer wrongly, and steps must work again once the link is back.
    let (stop_tx, stop_rx) = watch::channel(false);
    let succeeded_since_back = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let succeeded = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let back = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let worker = {
        let (t, succeeded_since_back, succeeded, back) = (
            t.clone(),
            succeeded_since_back.clone(),
            succeeded.clone(),
            back.clone(),
        );
        tokio::spawn(async move {
            let mut failures = 0u32;
            let mut i = 0u32;
            while !*stop_rx.borrow() {
                i += 1;
                let step = async {
                    let out = t.run(&argv(&["echo", &format!("step{i}")])).await?;
                    let back = roundtrip(local, format!("req{i}").as_bytes())
                        .await
                        .map_err(|e| RemoteError::Forward {
                            host: "test".into(),
                            addr: "127.0.0.1".into(),
                            port,
                            message: e.to_string(),
                        })?;
                    Ok::<_, RemoteError>((out.stdout_lossy(), back))
                };
                match within("a step", Duration::from_secs(15), step).await {
                    // Cut mid-request: closed without an answer, as an HTTP client sees it.
                    Ok((_, answer)) if answer.is_empty() => failures += 1,
                    Ok((out, answer)) => {
                        assert_eq!(out, format!("step{i}\n"));
                        assert_eq!(answer, format!("req{i}").as_bytes());
                        succeeded.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        if back.load(std::sync::atomic::Ordering::SeqCst) {
                            succeeded_since_back.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        }
                    }
                    Err(_) => failures += 1,
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            failures
        })
    };
    // The cut comes under a sequence already running.
    within("5 steps before the cut", Duration::from_secs(30), async {
        while succeeded.load(std::sync::atomic::Ordering::SeqCst) < 5 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let killed_at = Instant::now();
    assert!(sshd.kill_sessions() >= 1, "no session process to kill");
    let up = link_until(&mut link, "reconnected", |l| {
        matches!(l, Link::Up { generation: 1 })
    })
    .await;
    let back_after = killed_at.elapsed();
    assert!(up.is_up());
    assert!(
        back_after < Duration::from_secs(10),
        "back after {back_after:?}"
    );
    back.store(true, std::sync::atomic::Ordering::SeqCst);
    within(
        "20 steps after the reconnect",
        Duration::from_secs(60),
        async {
            while succeeded_since_back.load(std::sync::atomic::Ordering::SeqCst) < 20 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
    )
    .await;
    stop_tx.send(true).unwrap();
    // Steps in flight at the cut may fail (how many depends on timing); what matters is that
    // none hung or answered wrongly, and that steps work again.
    let failures = within("the worker", Duration::from_secs(30), worker)
        .await
        .unwrap();
    eprintln!("{failures} step(s) failed around the reconnect");
    // The same local port still forwards, over the new connection.
    assert_eq!(roundtrip(local, b"after").await.unwrap(), b"after");
    assert_eq!(tunnel.local_addr(), local);
    assert_eq!(logins(&sshd), 2, "{}", sshd.log());
    // One warning when lost and one line when back, not one per failed request.
    let text = logs.text();
    assert_eq!(text.matches("lost the SSH connection").count(), 1, "{text}");
    assert_eq!(text.matches("reconnected to").count(), 1, "{text}");
    assert!(
        text.contains("WARN") && text.contains("gpu1: lost the SSH connection to"),
        "{text}"
    );
    tunnel.close().await;
    echo.abort();
}

#[tokio::test]
async fn a_host_gone_for_seconds_and_back_on_the_same_port_is_reconnected() {
    let logs = LogBuffer::default();
    let _guard = logs.install_at("fleet=debug");
    let mut sshd = Sshd::start();
    let kh = sshd.known_hosts_file("kh", &[sshd.known_hosts_line()]);
    let opts = ConnectOptions {
        connect_timeout: Duration::from_secs(1),
        ..ConnectOptions::default()
    };
    let t = connect(&sshd.host_spec("gpu1", Some(200), &kh), &opts).await;
    let mut link = t.link();
    let (port, echo) = echo_server().await;
    let tunnel = t.forward("127.0.0.1", port).await.unwrap();
    let local = tunnel.local_addr();
    assert_eq!(roundtrip(local, b"before").await.unwrap(), b"before");

    sshd.stop();
    // Why it ended depends on how the kernel closed the socket (FIN or RST): not asserted.
    link_until(&mut link, "down", |l| matches!(l, Link::Down { .. })).await;

    // While down, a new connection on the forwarded port is closed at once, not left hanging.
    let start = Instant::now();
    let answer = within(
        "a forwarded request while down",
        Duration::from_secs(2),
        roundtrip(local, b"x"),
    )
    .await;
    assert!(
        answer.as_ref().map_or(true, |b| b.is_empty()),
        "an answer while down: {answer:?}"
    );
    assert!(
        start.elapsed() < Duration::from_millis(500),
        "{:?}",
        start.elapsed()
    );
    // A command waits for the link up to the connect timeout, then says what is wrong.
    let start = Instant::now();
    let err = t.run(&argv(&["true"])).await.unwrap_err();
    let waited = start.elapsed();
    assert!(matches!(err, RemoteError::LinkDown { .. }), "{err:?}");
    assert!(
        (Duration::from_millis(900)..Duration::from_secs(5)).contains(&waited),
        "{waited:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.starts_with("gpu1: the SSH connection to ") && msg.contains("is down"),
        "{msg}"
    );

    // Down while reconnecting fails again and again, never up by mistake.
    within(
        "two failed reconnect attempts",
        Duration::from_secs(30),
        async {
            while logs.text().matches("reconnect attempt").count() < 2 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
    )
    .await;
    assert!(
        matches!(*link.borrow(), Link::Down { .. }),
        "nothing answers yet"
    );
    sshd.restart();
    let up = link_until(&mut link, "back up", |l| matches!(l, Link::Up { .. })).await;
    assert!(matches!(up, Link::Up { generation: 1 }), "{up:?}");
    let out = t.run(&argv(&["echo", "back"])).await.unwrap();
    assert_eq!(out.stdout_lossy(), "back\n");
    assert_eq!(roundtrip(local, b"after").await.unwrap(), b"after");
    tunnel.close().await;
    echo.abort();
}

#[tokio::test]
async fn a_hung_host_is_found_by_keepalives_from_ssh_options() {
    let sshd = Sshd::start();
    let kh = sshd.known_hosts_file("kh", &[sshd.known_hosts_line()]);
    let mut spec = sshd.host_spec("gpu1", None, &kh);
    spec.ssh_options
        .insert("ServerAliveInterval".into(), "1".into());
    spec.ssh_options
        .insert("ServerAliveCountMax".into(), "2".into());
    let t = connect(&spec, &ConnectOptions::default()).await;
    let mut link = t.link();
    // The processes serving the connection stop answering, but the TCP connection stays open:
    // only keepalives can tell.
    let stopped_at = Instant::now();
    assert!(sshd.signal_sessions(libc::SIGSTOP) >= 1);
    let down = link_until(&mut link, "down", |l| matches!(l, Link::Down { .. })).await;
    let found_after = stopped_at.elapsed();
    let Link::Down { reason, .. } = &down else {
        unreachable!()
    };
    assert_eq!(
        *reason,
        LinkLoss::Keepalive {
            interval: Duration::from_secs(1),
            max: 2
        }
    );
    // Three intervals of silence (OpenSSH counts the same way), and well before TCP gives up.
    assert!(
        (Duration::from_secs(2)..Duration::from_secs(8)).contains(&found_after),
        "{found_after:?}"
    );
    // The listener still answers: a new connection replaces the hung one.
    link_until(&mut link, "back up", |l| {
        matches!(l, Link::Up { generation: 1 })
    })
    .await;
    assert!(t.run(&argv(&["true"])).await.unwrap().success());
}

#[tokio::test]
async fn a_host_back_with_another_host_key_is_refused_for_good() {
    let mut sshd = Sshd::start();
    let kh = sshd.known_hosts_file("kh", &[sshd.known_hosts_line()]);
    let trusted = std::fs::read_to_string(&kh).unwrap();
    let t = connect(
        &sshd.host_spec("gpu1", None, &kh),
        &ConnectOptions::default(),
    )
    .await;
    let mut link = t.link();
    sshd.stop();
    link_until(&mut link, "down", |l| matches!(l, Link::Down { .. })).await;
    // Reinstalled, or an impostor: same address and port, another key.
    let other = keygen(sshd.dir.path(), "other_host_key");
    std::fs::copy(&other, &sshd.host_key).unwrap();
    std::fs::copy(
        other.with_extension("pub"),
        sshd.host_key.with_extension("pub"),
    )
    .unwrap();
    sshd.restart();
    let failed = link_until(&mut link, "refused", |l| matches!(l, Link::Failed { .. })).await;
    let Link::Failed { error, .. } = &failed else {
        unreachable!()
    };
    assert!(
        matches!(**error, RemoteError::HostKeyChanged { .. }),
        "{error:?}"
    );
    let err = t.run(&argv(&["true"])).await.unwrap_err();
    assert!(matches!(err, RemoteError::LinkFailed { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("has CHANGED") && msg.contains("stopped reconnecting"),
        "{msg}"
    );
    assert_eq!(
        std::fs::read_to_string(&kh).unwrap(),
        trusted,
        "known_hosts must not change"
    );
}
