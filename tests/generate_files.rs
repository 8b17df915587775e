//! `fleet generate --concurrency auto` against dense-model sims as SGLang 0.5.23 runs them: a
//! `/server_info` cap of 4096 over a pool that holds a few hundred requests, under a low
//! open-file limit. Every id completes, fleet never runs out of files, and no server is taken
//! out.

mod common;

use std::os::unix::process::CommandExt;
use std::path::Path;

use common::generate::*;
use serde_json::json;

/// The server: a dense model, a 16,384-token KV pool, a 2048-token context.
const DENSE: [&str; 8] = [
    "--sim-dense",
    "--max-total-tokens",
    "16384",
    "--context-length",
    "2048",
    "--sim-time-scale",
    "50",
    "--disable-overlap-schedule",
];

/// `n` prompts of about 48 tokens (the sim counts a token per 4 characters).
fn prompts(path: &Path, n: usize) {
    let filler = "abcd".repeat(46);
    let lines: Vec<String> = (0..n)
        .map(|i| json!({"id": format!("p{i}"), "prompt": format!("{i:05} {filler}")}).to_string())
        .collect();
    write_lines(path, &lines);
}

/// Runs `fleet generate` with `RLIMIT_NOFILE` at `soft`/`hard` for it alone.
fn generate_limited(
    out: &Path,
    prompts: &Path,
    urls: &[&str],
    (soft, hard): (u64, u64),
) -> std::process::Output {
    let mut cmd = generate(out, prompts, urls);
    cmd.args(["--concurrency", "auto", "--max-tokens", "16"]);
    // SAFETY: setrlimit is async-signal-safe and touches nothing of the parent's.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: soft,
                rlim_max: hard,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.output().unwrap()
}

/// This process's hard `RLIMIT_NOFILE`: a child may keep it, not exceed it.
fn hard_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes only the struct passed.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    assert!(
        lim.rlim_max >= 2048,
        "this test needs a hard open-file limit of 2048 or more, not {}",
        lim.rlim_max
    );
    lim.rlim_max
}

fn assert_clean(stderr: &str) {
    assert!(!stderr.contains("Too many open files"), "{stderr}");
    assert!(!stderr.contains("taken out"), "{stderr}");
    assert!(!stderr.contains("paused"), "{stderr}");
}

#[test]
fn auto_on_dense_servers_under_a_low_hard_open_file_limit_completes_every_id() {
    let a = Sim::start(&DENSE);
    let b = Sim::start(&DENSE);
    assert_eq!(a.cap(), 4096, "the general cap, as 0.5.23 reports it");
    let tmp = tempfile::tempdir().unwrap();
    let (input, out) = (tmp.path().join("prompts.jsonl"), tmp.path().join("out"));
    prompts(&input, 3000);
    let o = generate_limited(&out, &input, &[&a.url, &b.url], (200, 200));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert_clean(&stderr);
    assert_exactly_once(&out, 3000);
    assert!(failures(&out).is_empty());
    // The limit cannot be raised: auto takes what it leaves, and says so once.
    assert_eq!(
        stderr.matches("the open-file limit (200)").count(),
        1,
        "{stderr}"
    );
    let p = progress(&out);
    assert_eq!(p["status"], "done");
    for i in p["instances"].as_array().unwrap() {
        let c = i["concurrency"].as_u64().unwrap();
        assert!(c < 100, "{i}");
    }
    assert!(p["rate_per_sec"].as_f64().unwrap() > 0.0, "{p}");
}

#[test]
fn auto_raises_a_low_soft_limit_and_follows_the_kv_pool_not_the_cap() {
    let a = Sim::start(&DENSE);
    let b = Sim::start(&DENSE);
    let tmp = tempfile::tempdir().unwrap();
    let (input, out) = (tmp.path().join("prompts.jsonl"), tmp.path().join("out"));
    prompts(&input, 3000);
    let o = generate_limited(&out, &input, &[&a.url, &b.url], (200, hard_limit()));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert_clean(&stderr);
    assert!(!stderr.contains("open-file limit"), "raised: {stderr}");
    assert_exactly_once(&out, 3000);
    let p = progress(&out);
    // 16,384 tokens over ~48 + 16 a request: a few hundred, never the 4096 cap.
    for i in p["instances"].as_array().unwrap() {
        let c = i["concurrency"].as_u64().unwrap();
        assert!((200..=600).contains(&c), "{i}");
    }
}
