//! A jump host's connection lost under a running forward, through the library: the chain is
//! rebuilt (a new connection to the bastion, then to the target through it) and the forward
//! keeps its local port. Alone in its test binary because it sets this process's HOME, whose
//! `~/.ssh/config` the library reads.

mod common;

use std::time::Duration;

use common::Sshd;
use common::netns::Hops;
use fleet::config::{GpuSelection, MachineSpec, parse_ssh_target};
use fleet::remote::{self, ConnectOptions, Detached, Link};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `GET /health` through `addr`; the status line's code, or the error.
async fn health(addr: std::net::SocketAddr) -> std::io::Result<String> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(b"GET /health HTTP/1.1\r\nHost: sim\r\nConnection: close\r\n\r\n")
        .await?;
    let mut back = Vec::new();
    s.read_to_end(&mut back).await?;
    let text = String::from_utf8_lossy(&back).into_owned();
    Ok(text.lines().next().unwrap_or("").to_string())
}

fn logins(sshd: &Sshd) -> usize {
    sshd.log().matches("Accepted publickey").count()
}

#[tokio::test]
async fn a_lost_jump_host_connection_rebuilds_the_chain_and_the_forward_keeps_its_port() {
    let hops = Hops::start(1, &[("FAKE_PCT_RUNNING", "200")]);
    let home = hops.home("pve");
    // SAFETY: the only test of this binary, before it starts any thread of its own.
    unsafe { std::env::set_var("HOME", home.path()) };
    let spec = MachineSpec {
        name: "ct200".into(),
        ssh: Some(parse_ssh_target("pve").unwrap()),
        container: Some(200),
        gpus: GpuSelection::All,
        address: Some("127.0.0.1".into()),
        ssh_options: Default::default(),
    };
    let t = remote::connect(&spec, &ConnectOptions::default())
        .await
        .unwrap();
    let mut link = t.link();
    // A server inside the container, on the target's loopback: reachable only via the chain.
    let port = 25700u16;
    let server = Detached {
        argv: [
            common::local_fleet::SIM,
            "--model-path",
            "/models/test",
            "--port",
            &port.to_string(),
            "--sim-startup-secs",
            "0",
        ]
        .map(String::from)
        .into(),
        env: Default::default(),
        log: "/tmp/sim/server.log".into(),
        pidfile: "/tmp/sim/pid".into(),
    };
    let pid = t.spawn_detached(&server).await.unwrap();
    let tunnel = t.forward("127.0.0.1", port).await.unwrap();
    let local = tunnel.local_addr();
    let mut status = String::new();
    for _ in 0..200 {
        status = health(local).await.unwrap_or_default();
        if status.starts_with("HTTP/1.1 200") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        status.starts_with("HTTP/1.1 200"),
        "no healthy sim: {status:?}"
    );

    // The bastion's process serving fleet dies; pve's connection, tunnelled through it, ends too.
    assert!(hops.bastion(0).kill_sessions() >= 1);
    let up = tokio::time::timeout(
        Duration::from_secs(30),
        link.wait_for(|l| matches!(l, Link::Up { generation: 1 })),
    )
    .await
    .expect("reconnected through the bastion within 30 s")
    .unwrap()
    .clone();
    assert!(up.is_up());
    assert_eq!(tunnel.local_addr(), local);
    let status = health(local).await.unwrap();
    assert!(status.starts_with("HTTP/1.1 200"), "{status:?}");
    // A new bastion connection, and a new pve connection through it.
    assert_eq!(logins(hops.bastion(0)), 2, "{}", hops.bastion(0).log());
    assert_eq!(logins(hops.target()), 2, "{}", hops.target().log());
    let out = t
        .run(&["kill".to_string(), "--".to_string(), format!("-{pid}")])
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr_lossy());
    tunnel.close().await;
}
