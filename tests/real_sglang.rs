//! fleet against the real SGLang 0.5.23 server on the CPU (a tiny random-weight Llama, the
//! stand-in `sgl_kernel`), through the real binary, real sshd and the fake `pct`, as on a Proxmox
//! host: `up` of 2 servers, `status`, `logs`, `generate` (a prompt over the context, a chat
//! `max_tokens` over it, a Batch API file whose output bodies the `openai` SDK validates, 5,000
//! prompts at `--concurrency auto` under `ulimit -n 1024`), a 2-candidate `sweep`, and `down`,
//! after which no process of the servers is left.

mod common;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Instant;

use common::generate::{assert_exactly_once, completions, failures, progress, write_lines};
use common::real::{CONTEXT, RealSglang};
use common::world::World;
use serde_json::{Value, json};

/// One world, one container with two (CPU) "GPUs", the real server on each.
struct Real {
    world: World,
    dir: tempfile::TempDir,
    /// Where the stand-in `sgl_kernel` logs any call of its ops; also marks the servers'
    /// processes (it is in their environment), so the test finds every one of them.
    calls: PathBuf,
}

impl Real {
    fn new() -> Real {
        let real = RealSglang::find();
        let world = World::new(1);
        world.inventory("[0, 1]");
        let calls = Path::new(env!("CARGO_TARGET_TMPDIR")).join(common::unique("sgl-calls"));
        let port_base = common::free_port_base(2);
        let profiles = world.home.path().join("profiles");
        std::fs::create_dir_all(&profiles).unwrap();
        std::fs::write(
            profiles.join("real.yaml"),
            real.profile(port_base, &calls, &[]),
        )
        .unwrap();
        Real {
            world,
            dir: tempfile::tempdir().unwrap(),
            calls,
        }
    }

    fn fleet(&self, args: &[&str]) -> Output {
        self.world.fleet(args).output().unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let o = self.fleet(args);
        assert!(
            o.status.success(),
            "fleet {args:?} exited {:?}\nstdout:\n{}\nstderr:\n{}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// `fleet generate` with its soft and hard open-file limits at 1024, as `ulimit -n 1024`
    /// leaves a shell.
    fn generate(&self, prompts: &Path, out: &Path, extra: &[&str]) -> (Output, f64) {
        let mut c = self.world.fleet(&["generate", "--prompts"]);
        c.arg(prompts).arg("--out").arg(out).args(extra);
        unsafe {
            c.pre_exec(|| {
                let limit = libc::rlimit {
                    rlim_cur: 1024,
                    rlim_max: 1024,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let t = Instant::now();
        let o = c.output().unwrap();
        (o, t.elapsed().as_secs_f64())
    }

    /// Pids of every process of this test's servers.
    fn server_processes(&self) -> Vec<u32> {
        RealSglang::processes(&self.calls)
    }
}

impl Drop for Real {
    fn drop(&mut self) {
        let _ = self.fleet(&["down", "--grace", "10s"]);
    }
}

fn text_prompts(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            json!({"id": format!("p{i}"), "prompt": format!("question {i}: what is the number {i} plus one?")})
                .to_string()
        })
        .collect()
}

fn rate(out: &Path, secs: f64) -> f64 {
    completions(out).len() as f64 / secs
}

#[test]
fn the_real_server_through_ssh_and_pct() {
    let r = Real::new();

    // up: two real servers, each bound to the container's address, read for their limits.
    let started = Instant::now();
    let up = r.ok(&["up", "--profile", "real"]);
    let up_s = started.elapsed().as_secs_f64();
    eprintln!("fleet up of 2 real servers: {up_s:.1} s\n{up}");
    assert_eq!(up.matches(" ready ").count(), 2, "two servers ready:\n{up}");
    assert!(
        up.contains("0.5.23"),
        "the version the host really has:\n{up}"
    );

    // The real server's --help (it imports torch and sglang) is read once and then kept on the
    // host, keyed on the launcher, its venv's sglang version and server_args.py.
    let again = r.fleet(&["-v", "up", "--profile", "real", "--dry-run"]);
    let again_err = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success(), "{again_err}");
    assert!(again_err.contains("(cached)"), "{again_err}");

    // status: both running and healthy, read from the servers themselves.
    let status: Value = serde_json::from_str(&r.ok(&["status", "--json"])).unwrap();
    let rows = status.as_array().expect("a JSON array");
    assert_eq!(rows.len(), 2, "{status:#}");
    assert!(
        rows.iter()
            .all(|s| s["liveness"] == "running" && s["health"] == 200),
        "{status:#}"
    );

    // logs: the real server's own start-up lines.
    let logs = r.ok(&["logs", "ct200:0", "-n", "400"]);
    assert!(
        logs.contains("The server is fired up and ready to roll!"),
        "{logs}"
    );

    // A prompt over the context is the prompt's own failure; a chat max_tokens over the context
    // is clamped to what fits and completes.
    let small = r.dir.path().join("small.jsonl");
    let too_long = "word ".repeat(CONTEXT as usize + 50);
    write_lines(
        &small,
        &[
            json!({"id": "too-long", "prompt": too_long}).to_string(),
            json!({"id": "chat-1", "messages": [{"role": "user", "content": "say hello"}]})
                .to_string(),
            json!({"id": "chat-2", "messages": [{"role": "user", "content": "count to three"}]})
                .to_string(),
        ],
    );
    let small_out = r.dir.path().join("small-out");
    let (o, _) = r.generate(&small, &small_out, &["--max-tokens", "1000"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        o.status.code(),
        Some(1),
        "a prompt failed (for its own reason): {stderr}"
    );
    let failed = failures(&small_out);
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0]["id"], "too-long");
    assert_eq!(failed[0]["reason"], "prompt_too_long", "{failed:?}");
    let done = completions(&small_out);
    assert_eq!(done.len(), 2, "{done:?}");
    for c in &done {
        let (prompt, out) = (c["prompt_tokens"].as_u64(), c["completion_tokens"].as_u64());
        let (prompt, out) = (prompt.unwrap_or(0), out.unwrap_or(0));
        assert!(
            out > 0 && prompt + out <= CONTEXT,
            "asked for at most what fits: {c}"
        );
    }

    // A Batch API file gets the Batch API's output: the real server's bodies, whole, are what
    // the openai SDK reads; the prompt over the context carries the server's own message.
    let batch = r.dir.path().join("batch.jsonl");
    let line = |id: &str, url: &str, body: Value| {
        json!({"custom_id": id, "method": "POST", "url": url, "body": body}).to_string()
    };
    write_lines(
        &batch,
        &[
            line(
                "chat",
                "/v1/chat/completions",
                json!({"model": "tiny", "max_tokens": 8,
                       "messages": [{"role": "user", "content": "say hello"}]}),
            ),
            line(
                "text",
                "/v1/completions",
                json!({"model": "tiny", "max_tokens": 8, "prompt": "one two three"}),
            ),
            line(
                "too-long",
                "/v1/completions",
                json!({"model": "tiny", "max_tokens": 8, "prompt": too_long}),
            ),
        ],
    );
    let batch_out = r.dir.path().join("batch-out");
    let (o, _) = r.generate(&batch, &batch_out, &[]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let done = completions(&batch_out);
    let bodies: Vec<(String, Value)> = done
        .iter()
        .map(|l| {
            let url = match l["custom_id"].as_str() {
                Some("chat") => "/v1/chat/completions",
                _ => "/v1/completions",
            };
            (url.to_string(), l["response"]["body"].clone())
        })
        .collect();
    assert_eq!(
        RealSglang::find().validate_openai_bodies(&bodies),
        (1, 1),
        "{done:?}"
    );
    let failed = failures(&batch_out);
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0]["custom_id"], "too-long", "{failed:?}");
    assert_eq!(failed[0]["error"]["code"], "prompt_too_long", "{failed:?}");
    assert!(
        failed[0]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("longer than the model's context length"),
        "the server's words: {failed:?}"
    );

    // 5,000 prompts at --concurrency auto under ulimit -n 1024: every id once, no open-file
    // trouble; then the same at a fixed concurrency, for the rate comparison.
    let big = r.dir.path().join("big.jsonl");
    write_lines(&big, &text_prompts(5000));
    let auto_out = r.dir.path().join("auto-out");
    let (o, auto_s) = r.generate(
        &big,
        &auto_out,
        &["--max-tokens", "8", "--concurrency", "auto"],
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(!stderr.contains("Too many open files"), "{stderr}");
    assert_exactly_once(&auto_out, 5000);
    assert!(failures(&auto_out).is_empty(), "{:?}", failures(&auto_out));
    assert_eq!(progress(&auto_out)["status"], "done");
    let fixed_out = r.dir.path().join("fixed-out");
    let (o, fixed_s) = r.generate(
        &big,
        &fixed_out,
        &["--max-tokens", "8", "--concurrency", "400"],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_exactly_once(&fixed_out, 5000);
    eprintln!(
        "5,000 prompts on 2 real servers: auto {:.1} req/s ({auto_s:.1} s), --concurrency 400 \
         {:.1} req/s ({fixed_s:.1} s)",
        rate(&auto_out, auto_s),
        rate(&fixed_out, fixed_s)
    );

    // A 2-candidate sweep crowns the config that really is faster: a cap of 2 running requests
    // against 64.
    let sweep_json = r.dir.path().join("sweep.json");
    let sweep = r.ok(&[
        "sweep",
        "--set",
        "server.max_running_requests=2,64",
        "--input-len",
        "64",
        "--output-len",
        "32",
        "--warmup",
        "5s",
        "--duration",
        "20s",
        "--out",
        sweep_json.to_str().unwrap(),
    ]);
    eprintln!("{sweep}");
    let winner = sweep
        .lines()
        .find_map(|l| l.strip_prefix("winner: "))
        .unwrap_or_else(|| panic!("a winner:\n{sweep}"));
    assert!(winner.contains("max_running_requests=64"), "{sweep}");

    // down: every launcher, scheduler and detokenizer is gone.
    r.ok(&["down", "--grace", "30s"]);
    let left = r.server_processes();
    assert!(left.is_empty(), "processes left after down: {left:?}");
    assert_eq!(
        RealSglang::stub_calls(&r.calls),
        "",
        "no stand-in op is ever called"
    );
}
