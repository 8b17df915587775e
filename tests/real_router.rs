//! The gateway (`smg` 1.13.0 from PyPI) in front of the real SGLang 0.5.23 server on the CPU
//! (tests/common/real.rs), through the real binary, real sshd and the fake `pct`: `up` of 2
//! servers starts it with both as workers (it registers the real server's `/server_info` and
//! `/model_info`), a job through it (`generate --via-router`) answers every prompt exactly
//! once, and `down` stops it.

mod common;

use std::path::Path;

use common::generate::assert_exactly_once;
use common::real::RealSglang;
use common::smg::smg;
use common::world::World;

#[test]
fn the_gateway_fronts_the_real_server() {
    let real = RealSglang::find();
    let world = World::new(1);
    world.inventory("[0, 1]");
    let calls = Path::new(env!("CARGO_TARGET_TMPDIR")).join(common::unique("sgl-calls"));
    let port_base = common::free_port_base(2);
    let router_port = loop {
        let p = common::free_port_base(2);
        if !(port_base..port_base + 64).contains(&p) {
            break p;
        }
    };
    let profiles = world.home.path().join("profiles");
    std::fs::create_dir_all(&profiles).unwrap();
    let yaml = format!(
        "{}router:\n  launcher: [{}, launch]\n  port: {router_port}\n",
        real.profile(port_base, &calls, &[]),
        smg().display()
    );
    std::fs::write(profiles.join("real.yaml"), yaml).unwrap();
    let w = Down(world);
    let fleet = |args: &[&str]| {
        let o = w.0.fleet(args).output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        (o.status.code(), out, err)
    };
    let (code, out, err) = fleet(&["up", "--profile", "real"]);
    assert_eq!(code, Some(0), "up:\n{out}\n{err}");
    assert!(out.contains("2 of 2 workers ready"), "{out}");

    let home = w.0.home.path();
    let prompts = home.join("p.jsonl");
    let lines: String = (0..10)
        .map(|i| format!("{{\"id\": \"p{i}\", \"prompt\": \"Count to {i}:\"}}\n"))
        .collect();
    std::fs::write(&prompts, lines).unwrap();
    let dir = home.join("out");
    let (code, out, err) = fleet(&[
        "generate",
        "--via-router",
        "--prompts",
        prompts.to_str().unwrap(),
        "--out",
        dir.to_str().unwrap(),
        "--max-tokens",
        "8",
        "--concurrency",
        "4",
    ]);
    assert_eq!(code, Some(0), "generate --via-router:\n{out}\n{err}");
    assert_exactly_once(&dir, 10);

    let (code, _, err) = fleet(&["down", "--grace", "10s"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("on ct200: stopped"), "{err}");
}

/// Stops what the test started, passed or failed.
struct Down(World);

impl Drop for Down {
    fn drop(&mut self) {
        let _ = self.0.fleet(&["down", "--grace", "10s"]).output();
    }
}
