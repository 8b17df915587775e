//! Whole-run benchmark of the SSH transport against a real sshd on 127.0.0.1 (the test
//! harness's): 8 short commands over one multiplexed connection, against one command on the
//! same connection (target: ≤ 2×) and against 8 sequential OpenSSH `ssh host true` runs
//! (target: ≥ 4× faster). Prints the median of each over many rounds.
//!
//! `true` costs the server a fork and exec per session and nothing else, so on a machine with
//! few cores it measures sshd's CPU, not the transport; the same run with `sleep 0.05` (a
//! command that waits instead of computing) shows what multiplexing does when the host has
//! the CPU to spare.

#[path = "../tests/common/mod.rs"]
mod common;
mod headline;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Sshd;
use fleet::remote::{self, ConnectOptions, Transport};

const COMMANDS: usize = 8;

fn rounds() -> usize {
    if headline::quick() { 5 } else { 30 }
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

async fn timed<F: std::future::Future<Output = ()>>(f: impl Fn() -> F) -> Duration {
    // One warm-up round so that the first channel's setup cost is not counted twice.
    f().await;
    let mut samples = Vec::with_capacity(rounds());
    for _ in 0..rounds() {
        let start = Instant::now();
        f().await;
        samples.push(start.elapsed());
    }
    median(samples)
}

async fn run(t: &dyn Transport, argv: &[String]) {
    let out = t.run(argv).await.expect("run");
    assert!(out.success(), "{argv:?} failed: {}", out.stderr_lossy());
}

/// Median wall time of one command, then of `COMMANDS` at once, on the same connection.
async fn one_vs_many(t: &dyn Transport, argv: &[String]) -> (Duration, Duration) {
    let one = timed(|| run(t, argv)).await;
    let many = timed(|| async {
        futures::future::join_all((0..COMMANDS).map(|_| run(t, argv))).await;
    })
    .await;
    (one, many)
}

/// OpenSSH's `ssh` to the bench's sshd, batch mode, with `extra` options before the target.
fn openssh(sshd: &Sshd, known_hosts: &std::path::Path, extra: &[&std::ffi::OsStr]) -> Command {
    let mut cmd = Command::new("ssh");
    cmd.args([
        "-F",
        "/dev/null",
        "-o",
        "BatchMode=yes",
        "-o",
        "IdentitiesOnly=yes",
        "-p",
    ])
    .arg(sshd.port.to_string())
    .arg("-i")
    .arg(&sshd.client_key)
    .arg("-o")
    .arg(format!("UserKnownHostsFile={}", known_hosts.display()))
    .args(extra)
    .arg(format!("{}@127.0.0.1", sshd.user))
    .stdin(Stdio::null());
    cmd
}

fn openssh_true(sshd: &Sshd, known_hosts: &std::path::Path, extra: &[&std::ffi::OsStr]) {
    let status = openssh(sshd, known_hosts, extra)
        .arg("true")
        .status()
        .expect("OpenSSH's ssh client (apt-get install openssh-client)");
    assert!(status.success(), "ssh true failed:\n{}", sshd.log());
}

fn timed_sync(f: impl Fn()) -> Duration {
    f();
    let mut samples = Vec::with_capacity(rounds());
    for _ in 0..rounds() {
        let start = Instant::now();
        f();
        samples.push(start.elapsed());
    }
    median(samples)
}

/// The floor: OpenSSH's own multiplexing (a `ControlMaster` holding one connection, each
/// `ssh -S` a session on it, as fleet opens one per command), 1 command against `COMMANDS` at
/// once. Its `ssh -S` clients are processes of their own, so the floor also pays a local fork
/// and exec per command, which fleet does not.
fn openssh_mux(sshd: &Sshd, known_hosts: &std::path::Path) -> (Duration, Duration) {
    let socket = sshd.dir.path().join("cm");
    let s = socket.as_os_str();
    let mut master = openssh(
        sshd,
        known_hosts,
        &["-M".as_ref(), "-S".as_ref(), s, "-N".as_ref()],
    )
    .spawn()
    .expect("OpenSSH's ssh client");
    let started = Instant::now();
    // `-O check` answers once the master holds an authenticated connection.
    while !openssh(
        sshd,
        known_hosts,
        &["-S".as_ref(), s, "-O".as_ref(), "check".as_ref()],
    )
    .stderr(Stdio::null())
    .status()
    .unwrap()
    .success()
    {
        assert!(
            master.try_wait().unwrap().is_none(),
            "the ControlMaster exited:\n{}",
            sshd.log()
        );
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no ControlMaster in 30 s"
        );
        std::thread::yield_now();
    }
    let mux: [&std::ffi::OsStr; 2] = ["-S".as_ref(), s];
    let one = timed_sync(|| openssh_true(sshd, known_hosts, &mux));
    let many = timed_sync(|| {
        let children: Vec<_> = (0..COMMANDS)
            .map(|_| {
                openssh(sshd, known_hosts, &mux)
                    .arg("true")
                    .spawn()
                    .unwrap()
            })
            .collect();
        for mut c in children {
            assert!(c.wait().unwrap().success(), "ssh -S true failed");
        }
    });
    let _ = master.kill();
    let _ = master.wait();
    (one, many)
}

fn main() {
    let sshd = Sshd::start();
    let kh = sshd.known_hosts_file("kh", &[sshd.known_hosts_line()]);
    let spec = sshd.host_spec("bench", None, &kh);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");

    let true_cmd = vec!["true".to_string()];
    let sleep_cmd = vec!["sleep".to_string(), "0.05".to_string()];
    let (connect, (one, eight), (one_sleep, eight_sleep)) = rt.block_on(async {
        let start = Instant::now();
        let t = remote::connect(&spec, &ConnectOptions::default())
            .await
            .expect("connect");
        let connect = start.elapsed();
        (
            connect,
            one_vs_many(t.as_ref(), &true_cmd).await,
            one_vs_many(t.as_ref(), &sleep_cmd).await,
        )
    });

    let (mux_one, mux_eight) = openssh_mux(&sshd, &kh);
    openssh_true(&sshd, &kh, &[]);
    let openssh_rounds = rounds() / 3;
    let mut samples = Vec::with_capacity(openssh_rounds);
    for _ in 0..openssh_rounds {
        let start = Instant::now();
        for _ in 0..COMMANDS {
            openssh_true(&sshd, &kh, &[]);
        }
        samples.push(start.elapsed());
    }
    let openssh = median(samples);

    let vs_one = eight.as_secs_f64() / one.as_secs_f64();
    let floor = mux_eight.as_secs_f64() / mux_one.as_secs_f64();
    // ≤ 2× one command, unless OpenSSH's own multiplexing cannot do it on this host either:
    // then the target is its ratio, the floor the host's fork and exec per session set.
    let mux_met = vs_one <= 2.0_f64.max(floor);
    let vs_openssh = openssh.as_secs_f64() / eight.as_secs_f64();
    println!(
        "ssh transport, {COMMANDS} × `true` on one host (median of {} rounds; OpenSSH {openssh_rounds})",
        rounds()
    );
    println!(
        "  connect + auth (once)                 {:>8.2} ms",
        ms(connect)
    );
    println!(
        "  1 command, one connection             {:>8.2} ms",
        ms(one)
    );
    println!(
        "  {COMMANDS} commands, one connection            {:>8.2} ms",
        ms(eight)
    );
    println!(
        "  {COMMANDS} sequential OpenSSH `ssh host true`  {:>8.2} ms",
        ms(openssh)
    );
    println!(
        "  OpenSSH ControlMaster, 1 `ssh -S`     {:>8.2} ms",
        ms(mux_one)
    );
    println!(
        "  OpenSSH ControlMaster, {COMMANDS} `ssh -S`    {:>8.2} ms",
        ms(mux_eight)
    );
    println!(
        "  {COMMANDS} vs 1: {vs_one:.2}×; OpenSSH's multiplexing (the floor): {floor:.2}× \
         (target ≤ 2×, or ≤ the floor where it is above 2×: {})",
        if mux_met { "met" } else { "MISSED" }
    );
    println!(
        "  vs OpenSSH: {vs_openssh:.1}× faster (target ≥ 4×: {})",
        if vs_openssh >= 4.0 { "met" } else { "MISSED" }
    );
    println!("same with `sleep 0.05` (waits, leaves the CPU to sshd)");
    println!(
        "  1 command                              {:>8.2} ms",
        ms(one_sleep)
    );
    println!(
        "  {COMMANDS} commands                             {:>8.2} ms",
        ms(eight_sleep)
    );
    let vs_one_sleep = eight_sleep.as_secs_f64() / one_sleep.as_secs_f64();
    println!("  {COMMANDS} vs 1: {vs_one_sleep:.2}×");
    headline::line(
        "ssh.mux.true",
        &format!(
            "{vs_one:.2}× ({:.1} vs {:.1} ms); floor, OpenSSH's ControlMaster in the same run: \
             {floor:.2}× ({:.1} vs {:.1} ms)",
            ms(eight),
            ms(one),
            ms(mux_eight),
            ms(mux_one)
        ),
        "8 × `true` on one host over one connection ≤ 2× one command, or ≤ OpenSSH's own \
         multiplexing (the floor) where the host's fork and exec per session keep that above 2×",
        Some(mux_met),
    );
    headline::line(
        "ssh.mux.sleep",
        &format!(
            "{vs_one_sleep:.2}× ({:.1} vs {:.1} ms)",
            ms(eight_sleep),
            ms(one_sleep)
        ),
        "8 × `sleep 0.05` on one host over one connection ≤ 2× one command",
        Some(vs_one_sleep <= 2.0),
    );
    headline::line(
        "ssh.vs_openssh",
        &format!(
            "{vs_openssh:.0}× faster ({:.1} ms vs {:.0} ms)",
            ms(eight),
            ms(openssh)
        ),
        "8 × `true` over one connection ≥ 4× faster than 8 sequential OpenSSH `ssh host true`",
        Some(vs_openssh >= 4.0),
    );
}
