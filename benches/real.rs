//! `fleet up` of 2 real SGLang 0.5.23 servers on the CPU (the tests' tiny model, see the README's
//! real-SGLang section) through real sshd and the fake `pct`, against the same 2 servers started
//! by hand in parallel: the command lines and environments `fleet up --dry-run` gives, spawned
//! here directly and polled every 100 ms until both answer /health 200. Target (DESIGN §11):
//! `fleet up` ≤ 1.3× by hand.
//!
//!     scripts/real-sglang-env && cargo bench --bench real [-- --quick]

#[path = "../tests/common/mod.rs"]
mod common;
mod headline;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::real::RealSglang;
use common::world::World;
use serde_json::Value;

/// Whether `GET /health` at `address:port` answers 200.
fn healthy(address: &str, port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect((address, port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
    let _ = s.write_all(b"GET /health HTTP/1.0\r\nHost: x\r\n\r\n");
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.ends_with(b"200")
}

/// The servers of `up --dry-run --json`, started here in parallel; the time until all are ready.
fn by_hand(world: &World) -> Duration {
    let out = world
        .fleet(&["--json", "up", "--profile", "real", "--dry-run"])
        .output()
        .unwrap();
    let plan: Value = serde_json::from_slice(&out.stdout).expect("the dry run's JSON");
    let servers = plan.as_array().expect("a list of servers");
    let started = Instant::now();
    let mut children: Vec<(Child, String, u16)> = servers
        .iter()
        .map(|s| {
            let argv: Vec<&str> = s["argv"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap())
                .collect();
            let mut cmd = Command::new(argv[0]);
            cmd.args(&argv[1..])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            for (k, v) in s["env"].as_object().unwrap() {
                cmd.env(k, v.as_str().unwrap());
            }
            let address = argv
                .iter()
                .skip_while(|a| **a != "--host")
                .nth(1)
                .expect("the address the server binds (--host)")
                .to_string();
            let port = s["port"].as_u64().unwrap() as u16;
            (cmd.spawn().expect("start a server"), address, port)
        })
        .collect();
    let mut ready = vec![false; children.len()];
    while ready.iter().any(|r| !r) {
        for (i, (child, address, port)) in children.iter_mut().enumerate() {
            if !ready[i] {
                assert!(
                    child.try_wait().unwrap().is_none(),
                    "a server died starting"
                );
                ready[i] = healthy(address, *port);
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(900),
            "not ready in 15 min"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let took = started.elapsed();
    for (child, _, _) in &mut children {
        // SAFETY: signalling a child this bench spawned, by its pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    }
    for (child, _, _) in &mut children {
        let _ = child.wait();
    }
    took
}

fn main() {
    let real = RealSglang::find();
    // --quick: one server, a smoke test of the bench rather than the target's figure.
    let gpus = if headline::quick() { 1 } else { 2 };
    let world = World::new(1);
    world.inventory(if gpus == 1 { "[0]" } else { "[0, 1]" });
    let calls = std::env::temp_dir().join(common::unique("sgl-calls"));
    let profiles = world.home.path().join("profiles");
    std::fs::create_dir_all(&profiles).unwrap();
    std::fs::write(
        profiles.join("real.yaml"),
        real.profile(common::free_port_base(gpus), &calls, &[]),
    )
    .unwrap();

    let hand = by_hand(&world);
    let started = Instant::now();
    let out = world.fleet(&["up", "--profile", "real"]).output().unwrap();
    let up = started.elapsed();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let down = world.fleet(&["down"]).output().unwrap();
    assert!(
        down.status.success(),
        "{}",
        String::from_utf8_lossy(&down.stderr)
    );

    let ratio = up.as_secs_f64() / hand.as_secs_f64();
    println!(
        "{gpus} real SGLang 0.5.23 server(s) on the CPU: by hand {:.1} s, fleet up {:.1} s ({ratio:.2}x)",
        hand.as_secs_f64(),
        up.as_secs_f64()
    );
    headline::line(
        "real.up",
        &format!("{:.1} s", up.as_secs_f64()),
        "`fleet up` of 2 real SGLang 0.5.23 servers on the CPU (tiny model), through ssh + pct",
        None,
    );
    headline::line(
        "real.up_ratio",
        &format!(
            "{ratio:.2}× ({:.1} s against {:.1} s by hand, in parallel)",
            up.as_secs_f64(),
            hand.as_secs_f64()
        ),
        "`fleet up` of 2 real servers ≤ 1.3× starting them by hand in parallel",
        Some(ratio <= 1.3),
    );
}
