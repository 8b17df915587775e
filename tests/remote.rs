//! The transports through the library, against a real OpenSSH sshd on 127.0.0.1 and the fake
//! `pct` on its PATH: quoting, exit codes, multiplexing, detached processes, port forwarding,
//! host keys, authentication and connection failures.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::{Sshd, keygen, unique};
use fleet::config::{GpuSelection, MachineSpec};
use fleet::remote::{self, ConnectOptions, Detached, RemoteError, Transport};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn argv(words: &[&str]) -> Vec<String> {
    words.iter().map(|s| s.to_string()).collect()
}

async fn connect(spec: &MachineSpec) -> Arc<dyn Transport> {
    match remote::connect(spec, &ConnectOptions::default()).await {
        Ok(t) => t,
        Err(e) => panic!("connect {}: {e}", spec.name),
    }
}

async fn connect_err(spec: &MachineSpec, opts: &ConnectOptions) -> RemoteError {
    match remote::connect(spec, opts).await {
        Ok(t) => panic!("connecting to {} should fail, got {t:?}", spec.name),
        Err(e) => e,
    }
}

/// Shell syntax in values must reach the program as data, through every layer of quoting.
/// `here` maps a path on the target to where this process sees it (a container's /tmp is its
/// own).
async fn assert_values_arrive_literally(t: &dyn Transport, here: impl Fn(&str) -> PathBuf) {
    let marker = format!("/tmp/{}", unique("pwned"));
    let values = [
        format!("x; touch {marker}"),
        format!("$(touch {marker})"),
        format!("`touch {marker}`"),
        format!("a && touch {marker} || true"),
        "it's \"quoted\" \\ back".to_string(),
        "line1\nline2".to_string(),
        "*".to_string(),
        String::new(),
        "--flag=$HOME".to_string(),
        "tab\there ünïcode".to_string(),
    ];
    let mut cmd = argv(&["printf", "[%s]\\n"]);
    cmd.extend(values.iter().cloned());
    let out = t.run(&cmd).await.expect("run printf");
    assert!(out.success(), "printf failed: {}", out.stderr_lossy());
    let expected: String = values.iter().map(|v| format!("[{v}]\n")).collect();
    assert_eq!(out.stdout_lossy(), expected);
    assert!(
        !here(&marker).exists() && !Path::new(&marker).exists(),
        "{marker} was created: a value was run as shell code"
    );
    // The check can fail: the same path, written on purpose, is seen where it looks.
    let out = t.run(&argv(&["touch", &marker])).await.expect("run touch");
    assert!(out.success(), "touch failed: {}", out.stderr_lossy());
    assert!(here(&marker).exists(), "{} not seen from here", marker);
    std::fs::remove_file(here(&marker)).unwrap();
}

fn same_path(p: &str) -> PathBuf {
    PathBuf::from(p)
}

async fn assert_exit_codes_and_stderr(t: &dyn Transport) {
    let out = t
        .run(&argv(&["sh", "-c", "echo out; echo err >&2; exit 3"]))
        .await
        .expect("run sh");
    assert_eq!(out.status, Some(3));
    assert_eq!(out.stdout_lossy(), "out\n");
    assert_eq!(out.stderr_lossy(), "err\n");
    let out = t.run(&argv(&["true"])).await.expect("run true");
    assert!(out.success());
    // Megabytes on both streams at once, and output after the exit status is known to the
    // shell: everything up to the channel's close arrives.
    let out = t
        .run(&argv(&[
            "sh",
            "-c",
            "head -c 3000000 /dev/zero; head -c 2000000 /dev/zero >&2; echo end",
        ]))
        .await
        .expect("run big output");
    assert_eq!(
        (out.status, out.stdout.len(), out.stderr.len()),
        (Some(0), 3_000_004, 2_000_000)
    );
    assert!(out.stdout.ends_with(b"end\n"));
    // stdin is at EOF: `cat` must return at once instead of hanging.
    let out = t.run(&argv(&["cat"])).await.expect("run cat");
    assert_eq!((out.status, out.stdout.len()), (Some(0), 0));
}

#[tokio::test]
async fn ssh_passes_values_literally_and_reports_exit_status_and_stderr() {
    let sshd = Sshd::start();
    let kh = sshd.known_hosts_file("kh", &[sshd.known_hosts_line()]);
    let t = connect(&sshd.host_spec("gpu1", None, &kh)).await;
    assert_eq!(t.host(), "gpu1");
    assert_values_arrive_literally(t.as_ref(), same_path).await;
    assert_exit_codes_and_stderr(t.as_ref()).await;
    // The fixture bin/ is on the SSH side's PATH, so the fake pct is what runs.
    let out = t.run(&argv(&["sh", "-c", "command -v pct"])).await.unwrap();
    assert_eq!(
        out.stdout_lossy().trim(),
        common::fixtures_bin().join("pct").display().to_string()
    );
}

#[tokio::test]
async fn ssh_plus_pct_passes_values_literally_and_reports_exit_status() {
    let sshd = Sshd::start();
    let kh = sshd.known_hosts_file("kh", &[sshd.known_hosts_line()]);
    let t = connect(&sshd.host_spec("ct200", Some(200), &kh)).await;
    assert_values_arrive_literally(t.as_ref(), |p| sshd.container_path(200, p)).await;
    assert_exit_codes_and_stderr(t.as_ref()).await;
    assert_eq!(t.server_address().await.unwrap(), "127.0.0.1");
}

#[tokio::test]
async fn each_container_has_a_tmp_of_its_own_as_lxc_gives_it() {
    let sshd = Sshd::start_with_env(&[("FAKE_PCT_RUNNING", "200,201")]);
    let kh = sshd.known_hosts_file("kh", &[sshd.known_hosts_line()]);
    let ct200 = connect(&sshd.host_spec("ct200", Some(200), &kh)).await;
    let ct201 = connect(&sshd.host_spec("ct201", Some(201), &kh)).await;
    let host = connect(&sshd.host_spec("pve", None, &kh)).await;
    let file = format!("/tmp/{}", unique("left-by-fleet"));
    let write = argv(&["sh", "-c", "echo in-200 > \"$0\"", &file]);
    assert!(ct200.run(&write).await.unwrap().success());
    let read = argv(&["cat", &file]);
    assert_eq!(ct200.run(&read).await.unwrap().stdout_lossy(), "in-200\n");
    for (who, t) in [("the other container", &ct201), ("the host", &host)] {
        let out = t.run(&read).await.unwrap();
        assert_eq!(
            out.status,
            Some(1),
            "{who} sees {file}: {}",
            out.stdout_lossy()
        );
    }
    assert!(!Path::new(&file).exists(), "the client sees {file}");
    assert_eq!(
        std::fs::read_to_string(sshd.container_path(200, &file)).unwrap(),
        "in-200\n"
    );
}

#[tokio::test]
async fn a_container_address_not_in_the_inventory_is_discovered_once_with_hostname_i() {
    let sshd = Sshd::start();
    let kh = sshd.known_hosts_file("kh", &[sshd.known_hosts_line()]);
    let mut spec = sshd.host_spec("ct200", Some(200), &kh);
    spec.address = None;
    let t = connect(&spec).await;
    // The fake container is this machine, so its `hostname -I` is ours.
    let ours = std::process::Command::new("hostname")
        .arg("-I")
        .output()
        .unwrap();
    let first = String::from_utf8_lossy(&ours.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    assert_eq!(t.server_address().await.unwrap(), first);
    assert_eq!(t.server_address().await.unwrap(), first);
    let sessions = sshd.log().matches("Starting session: command").count();
    assert_eq!(sessions, 1, "hostname -I should run once:\n{}", sshd.log());
}

#[tokio::test]
async fn a_container_that_is_not_running_is_named_with_what_to_check() {
    let sshd = Sshd::start_with_env(&[("FAKE_PCT_STOPPED", "201")]);
    let kh = sshd.known_hosts_file("kh", &[sshd.known_hosts_line()]);
    for (ct, detail) in [
        (201, "container '201' not running!"),
        (
            999,
            "Configuration file 'nodes/pve/lxc/999.conf' does not exist",
        ),
    ] {
        let t = connect(&sshd.host_spec("ct-down", Some(ct), &kh)).await;
        let err = t.run(&argv(&["true"])).await.unwrap_err();
        assert!(
            matches!(err, RemoteError::ContainerNotRunning { container, .. } if container == ct),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(msg.starts_with("ct-down: container"), "{msg}");
        assert!(
            msg.contains(detail) && msg.contains(&format!("pct status {ct}")),
            "{msg}"
        );
    }
    // The program's own exit 255 is not mistaken for pct's.
    let t = connect(&sshd.host_spec("ct200", Some(200), &kh)).await;
    let out = t
        .run(&argv(&["sh", "-c", "echo boom >&2; exit 255"]))
        .await
        .unwrap();
    assert_eq!(out.status, Some(255));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twelve_concurrent_commands_share_one_connection_under_max_sessions_10() {
    let sshd = Sshd::start();
    let kh = sshd.known_hosts_file("kh", &[sshd.known_hosts_line()]);
    let t = connect(&sshd.host_spec("gpu1", None, &kh)).await;
    let runs = (0..12).map(|i| {
        let t = t.clone();
        async move {
            t.run(&argv(&[
                "sh",
                "-c",
                "sleep 0.3; echo \"$0\"",
                &format!("job{i}"),
            ]))
            .await
        }
    });
    let results = futures::future::join_all(runs).await;
    for (i, r) in results.into_iter().enumerate() {
        let out = r.unwrap_or_else(|e| panic!("job {i}: {e}"));
        assert!(
            out.success(),
            "job {i}: {:?} {}",
            out.status,
            out.stderr_lossy()
        );
        assert_eq!(out.stdout_lossy(), format!("job{i}\n"));
    }
    let sessions = sshd.log().matches("Accepted publickey").count();
    assert_eq!(sessions, 1, "expected one SSH connection:\n{}", sshd.log());
}

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

/// Process group id from /proc/PID/stat (field 5, after the parenthesised name).
fn pgid(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    after
        .split_whitespace()
        .nth(2)
        .expect("pgrp")
        .parse()
        .expect("pgrp number")
}

async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..500 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test]
async fn a_detached_process_outlives_the_command_and_the_ssh_session() {
    let sshd = Sshd::start();
    let kh = sshd.known_hosts_file("kh", &[sshd.known_hosts_line()]);
    // Paths inside the container, whose /tmp is its own; `here` is where this process sees them.
    let run_dir = format!("/tmp/{}", unique("run"));
    let log = format!("{run_dir}/logs/server.log");
    let pidfile = format!("{run_dir}/run/deep/server.pid");
    let here = |p: &str| sshd.container_path(200, p);
    let d = Detached {
        argv: argv(&[
            "sh",
            "-c",
            "echo \"greeting=$GREETING\"; echo to-stderr >&2; exec sleep 30",
        ]),
        env: BTreeMap::from([("GREETING".to_string(), "hi; $(id) 'q'".to_string())]),
        log: log.clone(),
        pidfile: pidfile.clone(),
    };
    let pid = {
        let t = connect(&sshd.host_spec("ct200", Some(200), &kh)).await;
        t.spawn_detached(&d).await.expect("spawn_detached")
        // The transport, and with it the SSH connection, is dropped here.
    };
    assert_eq!(
        std::fs::read_to_string(here(&pidfile)).unwrap().trim(),
        pid.to_string()
    );
    wait_for("the log", || {
        std::fs::read_to_string(here(&log)).is_ok_and(|l| l.contains("to-stderr"))
    })
    .await;
    // Its session gone (a hangup would have reached it by then), the process lives on.
    wait_for("the SSH session to end", || sshd.session_pids().is_empty()).await;
    assert!(pid_alive(pid), "pid {pid} died with the session");
    assert_eq!(
        pgid(pid),
        pid,
        "the process should lead its own process group"
    );
    let text = std::fs::read_to_string(here(&log)).unwrap();
    assert!(text.contains("greeting=hi; $(id) 'q'\n"), "{text}");
    // Stop what this test started, by its process group.
    unsafe { libc::kill(-(pid as i32), libc::SIGTERM) };
    wait_for("the detached process to stop", || !pid_alive(pid)).await;
}

#[tokio::test]
async fn local_transport_runs_spawns_and_forwards_directly() {
    let spec = MachineSpec {
        name: "here".into(),
        ssh: None,
        container: None,
        gpus: GpuSelection::All,
        address: None,
        ssh_options: BTreeMap::new(),
    };
    let t = connect(&spec).await;
    assert_values_arrive_literally(t.as_ref(), same_path).await;
    assert_exit_codes_and_stderr(t.as_ref()).await;
    let err = t
        .run(&argv(&["/nonexistent/prog"]))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("here: cannot start `/nonexistent/prog`"),
        "{err}"
    );
    let tunnel = t.forward("127.0.0.1", 30000).await.unwrap();
    assert_eq!(tunnel.local_addr().to_string(), "127.0.0.1:30000");
    let dir = tempfile::tempdir().unwrap();
    let d = Detached {
        argv: argv(&["sleep", "30"]),
        env: BTreeMap::new(),
        log: dir.path().join("l.log").display().to_string(),
        pidfile: dir.path().join("p.pid").display().to_string(),
    };
    let pid = t.spawn_detached(&d).await.unwrap();
    assert!(pid_alive(pid));
    unsafe { libc::kill(-(pid as i32), libc::SIGTERM) };
    wait_for("the detached process to stop", || !pid_alive(pid)).await;
}

/// An echo server on 127.0.0.1 that the test owns; returns its port and its task.
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

async fn roundtrip(addr: std::net::SocketAddr, payload: &[u8]) -> Vec<u8> {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to tunnel");
    s.write_all(payload).await.unwrap();
    s.shutdown().await.unwrap();
    let mut back = Vec::new();
    s.read_to_end(&mut back).await.unwrap();
    back
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ports_are_forwarded_over_ssh_and_through_pct() {
    let sshd = Sshd::start();
    let kh = sshd.known_hosts_file("kh", &[sshd.known_hosts_line()]);
    let (port, server) = echo_server().await;
    for (name, ct) in [("gpu1", None), ("ct200", Some(200))] {
        let t = connect(&sshd.host_spec(name, ct, &kh)).await;
        let tunnel = t.forward("127.0.0.1", port).await.expect("forward");
        let local = tunnel.local_addr();
        assert!(local.ip().is_loopback() && local.port() != port, "{local}");
        let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let (a, b) = tokio::join!(roundtrip(local, b"ping"), roundtrip(local, &big));
        assert_eq!(a, b"ping");
        assert_eq!(b.len(), big.len());
        assert!(b == big, "{name}: forwarded bytes differ");
        // A connection still open through the tunnel is cut by close, not left dangling.
        let mut open = tokio::net::TcpStream::connect(local).await.unwrap();
        open.write_all(b"held").await.unwrap();
        let mut held = [0u8; 4];
        open.read_exact(&mut held).await.unwrap();
        tunnel.close().await;
        let mut rest = Vec::new();
        let cut = open.read_to_end(&mut rest).await;
        assert!(cut.is_err() || rest.is_empty(), "{name}: {cut:?} {rest:?}");
        // Close has released the address: binding it proves nothing listens there any more.
        // (A connect to it could not: the kernel may pick that very port as the connect's own
        // source port and connect the socket to itself.)
        let rebound = tokio::net::TcpListener::bind(local).await;
        assert!(
            rebound.is_ok(),
            "{name}: tunnel still listening after close: {rebound:?}"
        );
    }
    server.abort();
    let _ = server.await;
}

#[tokio::test]
async fn an_unknown_host_key_is_refused_with_its_fingerprint_unless_accepted() {
    let sshd = Sshd::start();
    let kh = sshd.dir.path().join("new/known_hosts");
    let spec = sshd.host_spec("gpu1", None, &kh);
    let err = connect_err(&spec, &ConnectOptions::default()).await;
    assert!(matches!(err, RemoteError::UnknownHostKey { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.starts_with("gpu1: the host key of [127.0.0.1]:"),
        "{msg}"
    );
    assert!(
        msg.contains(&sshd.host_fingerprint()),
        "{msg} lacks {}",
        sshd.host_fingerprint()
    );
    assert!(
        msg.contains("--accept-new-host-key") && msg.contains(&kh.display().to_string()),
        "{msg}"
    );
    assert!(
        !kh.exists(),
        "nothing may be recorded without --accept-new-host-key"
    );

    let accept = ConnectOptions {
        accept_new_host_key: true,
        ..ConnectOptions::default()
    };
    let t = remote::connect(&spec, &accept).await.expect("accept-new");
    assert!(t.run(&argv(&["true"])).await.unwrap().success());
    let recorded = std::fs::read_to_string(&kh).unwrap();
    assert_eq!(recorded.trim(), sshd.known_hosts_line());
    // Now known: accepted without the flag, and OpenSSH's client agrees with what was written.
    connect(&spec).await;
    let out = std::process::Command::new("ssh-keygen")
        .args(["-F", &format!("[127.0.0.1]:{}", sshd.port), "-f"])
        .arg(&kh)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ssh-keygen -F does not find the recorded key"
    );
}

#[tokio::test]
async fn a_changed_host_key_is_always_refused_naming_the_line() {
    let sshd = Sshd::start();
    let other = keygen(sshd.dir.path(), "impostor");
    let kh = sshd.known_hosts_file(
        "kh",
        &[
            "# managed by hand".to_string(),
            format!("otherhost {}", common::public_key(&other)),
            format!("[127.0.0.1]:{} {}", sshd.port, common::public_key(&other)),
        ],
    );
    let spec = sshd.host_spec("gpu1", None, &kh);
    for accept_new_host_key in [false, true] {
        let opts = ConnectOptions {
            accept_new_host_key,
            ..ConnectOptions::default()
        };
        let err = connect_err(&spec, &opts).await;
        assert!(
            matches!(err, RemoteError::HostKeyChanged { line: 3, .. }),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.starts_with("gpu1: the host key of [127.0.0.1]:"),
            "{msg}"
        );
        assert!(
            msg.contains(&format!("{}:3", kh.display())) && msg.contains("CHANGED"),
            "{msg}"
        );
        assert!(msg.contains(&sshd.host_fingerprint()), "{msg}");
    }
    assert_eq!(
        std::fs::read_to_string(&kh).unwrap().lines().count(),
        3,
        "known_hosts must not change"
    );
}

#[tokio::test]
async fn a_key_the_server_does_not_accept_is_reported_with_the_keys_tried() {
    let sshd = Sshd::start();
    let kh = sshd.known_hosts_file("kh", &[sshd.known_hosts_line()]);
    let wrong = keygen(sshd.dir.path(), "not_authorized");
    let err = connect_err(
        &sshd.host_spec_with_key("gpu1", None, &kh, &wrong),
        &ConnectOptions::default(),
    )
    .await;
    assert!(matches!(err, RemoteError::AuthRefused { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.starts_with(&format!(
            "gpu1: {}@[127.0.0.1]:{} refused authentication",
            sshd.user, sshd.port
        )),
        "{msg}"
    );
    assert!(
        msg.contains(&wrong.display().to_string()) && msg.contains("authorized_keys"),
        "{msg}"
    );
}

#[tokio::test]
async fn rsa_keys_sign_with_the_sha2_hash_the_server_accepts() {
    // OpenSSH ≥ 8.8 refuses SHA-1 `ssh-rsa` signatures, so this only logs in if the client asks
    // for the server's best RSA hash.
    let sshd = Sshd::start();
    let kh = sshd.known_hosts_file("kh", &[sshd.known_hosts_line()]);
    let rsa = common::keygen_typed(sshd.dir.path(), "client_rsa", "rsa");
    sshd.authorize(&rsa);
    let t = connect(&sshd.host_spec_with_key("gpu1", None, &kh, &rsa)).await;
    assert!(t.run(&argv(&["true"])).await.unwrap().success());
    assert!(
        sshd.log().contains("Accepted publickey") && sshd.log().contains("RSA SHA256:"),
        "{}",
        sshd.log()
    );
}

#[tokio::test]
async fn a_passphrase_protected_key_is_skipped_with_a_hint_and_no_passphrase_prompt() {
    let sshd = Sshd::start();
    let kh = sshd.known_hosts_file("kh", &[sshd.known_hosts_line()]);
    let locked = sshd.dir.path().join("locked_key");
    std::fs::copy(&sshd.client_key, &locked).unwrap();
    let status = std::process::Command::new("ssh-keygen")
        .args(["-q", "-p", "-N", "not-logged-passphrase", "-P", "", "-f"])
        .arg(&locked)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let err = connect_err(
        &sshd.host_spec_with_key("gpu1", None, &kh, &locked),
        &ConnectOptions::default(),
    )
    .await;
    let msg = err.to_string();
    assert!(
        msg.contains(&format!(
            "{} (passphrase-protected: load it with `ssh-add",
            locked.display()
        )),
        "{msg}"
    );
    assert!(!msg.contains("not-logged-passphrase"), "{msg}");
}

#[tokio::test]
async fn nothing_listening_is_reported_as_unreachable() {
    let sshd = Sshd::start();
    let kh = sshd.known_hosts_file("kh", &[sshd.known_hosts_line()]);
    let mut spec = sshd.host_spec("gpu1", None, &kh);
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    spec.ssh.as_mut().unwrap().port = Some(closed);
    let err = connect_err(&spec, &ConnectOptions::default()).await;
    assert!(matches!(err, RemoteError::Unreachable { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.starts_with(&format!("gpu1: cannot connect to [127.0.0.1]:{closed}")),
        "{msg}"
    );
    assert!(msg.contains("sshd listens on that port"), "{msg}");
}

#[tokio::test]
async fn a_server_that_never_speaks_ssh_times_out() {
    let sshd = Sshd::start();
    let kh = sshd.known_hosts_file("kh", &[sshd.known_hosts_line()]);
    // The kernel completes the TCP handshake into the backlog; nothing ever answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut spec = sshd.host_spec("gpu1", None, &kh);
    spec.ssh.as_mut().unwrap().port = Some(silent.local_addr().unwrap().port());
    let opts = ConnectOptions {
        connect_timeout: Duration::from_millis(300),
        ..ConnectOptions::default()
    };
    let err = connect_err(&spec, &opts).await;
    assert!(matches!(err, RemoteError::Timeout { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.starts_with("gpu1: no SSH session with [127.0.0.1]:") && msg.contains("within 300ms"),
        "{msg}"
    );
    assert!(msg.contains("--connect-timeout"), "{msg}");
}

/// Collects what fleet logs in this thread.
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

#[tokio::test]
async fn remote_commands_are_logged_as_sent_with_secrets_masked() {
    let sshd = Sshd::start();
    let kh = sshd.known_hosts_file("kh", &[sshd.known_hosts_line()]);
    let logs = LogBuffer::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("fleet=debug")
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    // The current-thread test runtime runs every future on this thread.
    let _guard = tracing::subscriber::set_default(subscriber);
    remote::add_secret("sk-live-123");
    let t = connect(&sshd.host_spec("ct200", Some(200), &kh)).await;
    let out = t
        .run(&argv(&["echo", "--api-key", "sk-live-123", "a b"]))
        .await
        .unwrap();
    assert_eq!(
        out.stdout_lossy(),
        "--api-key sk-live-123 a b\n",
        "masking is for logs only"
    );
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(
        !text.contains("sk-live-123"),
        "secret leaked into logs:\n{text}"
    );
    let sent = remote::quote_argv(
        "ct200",
        &argv(&[
            "pct",
            "exec",
            "200",
            "--",
            "bash",
            "-c",
            "echo --api-key *** 'a b'",
        ]),
    )
    .unwrap();
    assert!(
        text.contains(&sent),
        "log lacks the command as sent ({sent}):\n{text}"
    );
}
