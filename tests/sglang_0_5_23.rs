//! SGLang 0.5.23 as the reference, through the real binary against sglang-sim emulating it: the
//! no_buffer profile renders `--disable-overlap-schedule` and starts, the resolved strategy is
//! shown, preflight reads Python 3.13's `--help`, generation survives 0.5.23's own 400s, and a
//! model load stays quiet.

mod common;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::generate::{completions, failures, write_lines};
use common::local_fleet::{LocalFleet, SIM};
use serde_json::{Value, json};

/// A local fleet of 4 GPUs whose profiles share one free port range.
struct World {
    fleet: LocalFleet,
    port_base: u16,
    _ports: common::Ports,
}

impl World {
    fn new() -> World {
        let ports = common::reserve_ports(4);
        World {
            fleet: LocalFleet::new(4),
            port_base: ports.base,
            _ports: ports,
        }
    }

    /// A sim profile with a 1 s load at 20x (so 50 ms) unless `env` sets the time scale;
    /// `server` and `env` as YAML lines.
    fn profile(&self, name: &str, server: &str, env: &str) {
        let scale = if env.contains("SGLANG_SIM_TIME_SCALE") {
            ""
        } else {
            "  SGLANG_SIM_TIME_SCALE: \"20\"\n"
        };
        self.fleet.write_profile(
            name,
            &format!(
                "model: /models/test\nlauncher: [sglang-sim]\nport_base: {}\nserver:\n{server}\
                 env:\n  SGLANG_SIM_STARTUP_SECS: \"1\"\n{scale}\
                 \x20 SGLANG_SIM_GPU_STATE_DIR: \"{}\"\n{env}\
                 health: {{startup_timeout: 60s, poll: 1s}}\n",
                self.port_base,
                self.fleet.gpu_state().display()
            ),
        );
    }

    /// `fleet ARGS --json`: (exit code, stdout JSON, stderr).
    fn json(&self, args: &[&str]) -> (i32, Value, String) {
        let out = self
            .fleet
            .fleet()
            .args(args)
            .arg("--json")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "fleet {args:?}: not JSON ({e}): {}\n{stderr}",
                String::from_utf8_lossy(&out.stdout)
            )
        });
        (out.status.code().unwrap_or(-1), value, stderr)
    }
}

fn rows(v: &Value) -> &Vec<Value> {
    v.as_array().expect("a JSON array")
}

fn count(argv: &Value, flag: &str) -> usize {
    argv.as_array()
        .unwrap()
        .iter()
        .filter(|a| *a == flag)
        .count()
}

#[test]
fn the_no_buffer_profile_starts_on_0_5_23_and_0_5_10_and_up_shows_what_auto_resolves_to() {
    let w = World::new();
    w.profile("nb23", "  mamba_strategy: no_buffer\n", "");
    w.profile(
        "nb10",
        "  mamba_strategy: no_buffer\n",
        "  SGLANG_SIM_VERSION: \"0.5.10\"\n",
    );
    w.profile("auto23", "  mamba_strategy: auto\n", "");
    for (profile, gpu, flag) in [
        ("nb23", "0", "--mamba-radix-cache-strategy"),
        ("nb10", "1", "--mamba-scheduler-strategy"),
    ] {
        let (code, up, stderr) = w.json(&["up", "--profile", profile, "--gpus", gpu]);
        assert_eq!(code, 0, "{profile}: {stderr}");
        let row = &rows(&up)[0];
        assert_eq!(row["state"], "ready", "{row}");
        assert_eq!(row["mamba_strategy"], "no_buffer", "{row}");
        assert_eq!(
            count(&row["argv"], "--disable-overlap-schedule"),
            1,
            "{row}"
        );
        assert_eq!(count(&row["argv"], flag), 1, "{row}");
    }
    // On 0.5.23 `auto` keeps overlap on and so becomes the seed's slow extra_buffer: the table
    // says so, and so does `status`.
    let out = w
        .fleet
        .fleet()
        .args(["up", "--profile", "auto23", "--gpus", "2"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}");
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert!(header.contains(&"STRATEGY"), "{table}");
    assert!(
        table.lines().nth(1).unwrap().contains("extra_buffer"),
        "{table}"
    );
    let (code, status, stderr) = w.json(&["status"]);
    assert_eq!(code, 0, "{stderr}");
    let strategies: Vec<(&str, &str)> = rows(&status)
        .iter()
        .map(|s| {
            (
                s["profile"].as_str().unwrap(),
                s["mamba_strategy"].as_str().unwrap_or("?"),
            )
        })
        .collect();
    assert_eq!(strategies.len(), 3, "{status}");
    for (profile, strategy) in strategies {
        let want = if profile == "auto23" {
            "extra_buffer"
        } else {
            "no_buffer"
        };
        assert_eq!(strategy, want, "{profile}");
    }
}

#[test]
fn a_profile_that_already_lists_the_flag_renders_it_once_and_starts() {
    let w = World::new();
    w.profile(
        "listed",
        "  mamba_strategy: no_buffer\n  extra_args: [--disable-overlap-schedule]\n",
        "",
    );
    let (code, plan, stderr) = w.json(&["up", "--profile", "listed", "--gpus", "0", "--dry-run"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        count(&rows(&plan)[0]["argv"], "--disable-overlap-schedule"),
        1
    );
    let (code, up, stderr) = w.json(&["up", "--profile", "listed", "--gpus", "0"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(rows(&up)[0]["state"], "ready");
}

#[test]
fn preflight_reads_python_3_13_help_and_names_the_no_buffer_rules() {
    let w = World::new();
    // Python 3.13's argparse prints `--model-path, --model MODEL_PATH`: the metavar only once.
    let py313 = "  SGLANG_SIM_PYTHON: \"3.13\"\n";
    let help = std::process::Command::new(SIM)
        .arg("--help")
        .env("SGLANG_SIM_PYTHON", "3.13")
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&help.stdout).contains("\n  --model-path, --model MODEL_PATH\n")
    );
    w.profile("py313", "  mamba_strategy: no_buffer\n", py313);
    let (code, up, stderr) = w.json(&["up", "--profile", "py313", "--gpus", "0"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(rows(&up)[0]["state"], "ready");

    // The two no_buffer rules argparse cannot see, reported before anything starts.
    w.profile(
        "paged",
        "  mamba_strategy: no_buffer\n  attention_backend: trtllm_mha\n  extra_args: [--page-size, \"16\"]\n",
        py313,
    );
    let out = w
        .fleet
        .fleet()
        .args(["up", "--profile", "paged", "--gpus", "1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("preflight: 2 flag problem(s); nothing was started"),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "--page-size 16: no_buffer only supports page_size=1 (SGLang's validate_mamba_no_buffer"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("attention_backend trtllm_mha: no_buffer does not support it"),
        "{stderr}"
    );
    let (_, status, _) = w.json(&["status"]);
    assert_eq!(
        rows(&status).len(),
        1,
        "only the first profile runs: {status}"
    );
}

/// Starts one no_buffer server with an 8192-token context on GPU 0.
fn context_8192(w: &World) {
    w.profile(
        "ctx",
        "  mamba_strategy: no_buffer\n  context_length: 8192\n",
        "  SGLANG_SIM_TIME_SCALE: \"200\"\n",
    );
    let (code, _, stderr) = w.json(&["up", "--profile", "ctx", "--gpus", "0"]);
    assert_eq!(code, 0, "{stderr}");
}

fn generate(w: &World, prompts: &Path, out: &Path, extra: &[&str]) -> (i32, String) {
    let o = w
        .fleet
        .fleet()
        .arg("generate")
        .arg("--prompts")
        .arg(prompts)
        .arg("--out")
        .arg(out)
        .args(["-q", "--warmup", "0s"])
        .args(extra)
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn chat_asking_for_more_tokens_than_the_context_completes_every_line() {
    let w = World::new();
    context_8192(&w);
    let prompts = w.fleet.path().join("chat.jsonl");
    let lines: Vec<String> = (0..40)
        .map(|i| {
            json!({"id": format!("c{i}"), "messages": [{"role": "user", "content": format!("Tell me about topic {i}.")}]})
                .to_string()
        })
        .collect();
    write_lines(&prompts, &lines);
    let out = w.fleet.path().join("out");
    let (code, stderr) = generate(&w, &prompts, &out, &["--max-tokens", "9000"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(failures(&out).is_empty(), "{:?}", failures(&out));
    assert_eq!(completions(&out).len(), 40);
}

#[test]
fn a_reasoning_models_thought_is_kept_apart_and_an_answer_cut_off_while_thinking_succeeds() {
    let w = World::new();
    w.profile(
        "think",
        "  mamba_strategy: no_buffer\n  extra_args: [--reasoning-parser, qwen3]\n",
        "  SGLANG_SIM_TIME_SCALE: \"200\"\n",
    );
    let (code, _, stderr) = w.json(&["up", "--profile", "think", "--gpus", "0"]);
    assert_eq!(code, 0, "{stderr}");
    let prompts = w.fleet.path().join("think.jsonl");
    let line = |id: &str, max_tokens: u64| {
        json!({"custom_id": id, "method": "POST", "url": "/v1/chat/completions",
               "body": {"max_tokens": max_tokens,
                        "messages": [{"role": "user", "content": "Why is the sky blue?"}]}})
        .to_string()
    };
    write_lines(&prompts, &[line("whole", 4000), line("cut", 3)]);
    let out = w.fleet.path().join("out");
    // fleet's records, which keep the thought apart (a Batch API file writes the Batch API's
    // output by default, with the thought inside the body).
    let (code, stderr) = generate(&w, &prompts, &out, &["--output-format", "fleet"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(failures(&out).is_empty(), "{:?}", failures(&out));
    let done = completions(&out);
    let get = |id: &str| done.iter().find(|c| c["id"] == id).unwrap().clone();
    let whole = get("whole");
    let (thought, answer) = (
        whole["reasoning"].as_str().unwrap(),
        whole["output"].as_str().unwrap(),
    );
    assert!(!thought.is_empty() && !answer.is_empty(), "{whole}");
    assert!(!answer.contains("think>"), "{whole}");
    // Cut off after two words of thought: an empty answer, and still a completion.
    let cut = get("cut");
    assert_eq!(cut["output"], "", "{cut}");
    assert_eq!(cut["reasoning"].as_str().unwrap().split(' ').count(), 2);
    assert_eq!(cut["finish_reason"], "length");
    assert_eq!(cut["completion_tokens"], 3);
}

#[test]
fn prompts_at_the_schedulers_input_limit_are_prompt_too_long_even_after_a_clamp() {
    let w = World::new();
    context_8192(&w);
    // The sim counts ⌈characters / 4⌉ tokens. Its KV pool is far larger than the context, so
    // SGLang's limit is min(8192 − 1, KV − 1) − 5 = 8186 input tokens.
    let prompts = w.fleet.path().join("long.jsonl");
    let text = |tokens: usize| "abcd".repeat(tokens);
    write_lines(
        &prompts,
        &[
            json!({"id": "at-limit", "prompt": text(8186)}).to_string(),
            json!({"id": "longest", "prompt": text(8185)}).to_string(),
            json!({"id": "just-fits", "prompt": text(8180)}).to_string(),
            json!({"id": "short", "prompt": "hello"}).to_string(),
        ],
    );
    let out = w.fleet.path().join("out");
    let (code, stderr) = generate(&w, &prompts, &out, &["--max-tokens", "4096"]);
    assert_eq!(code, 1, "a prompt failed for good: {stderr}");
    let failed = failures(&out);
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0]["id"], "at-limit");
    assert_eq!(failed[0]["reason"], "prompt_too_long", "{failed:?}");
    assert!(
        failed[0]["error"]
            .as_str()
            .unwrap()
            .contains("the prompt is 8186 tokens; the server runs prompts of at most 8185 tokens"),
        "{failed:?}"
    );
    let done = completions(&out);
    let fits = done
        .iter()
        .find(|c| c["id"] == "just-fits")
        .expect("completed");
    // Clamped once to C − P − 1 = 11 output tokens.
    assert_eq!(fits["completion_tokens"], 11, "{fits}");
    // The bound the message names is the longest prompt that runs.
    let longest = done
        .iter()
        .find(|c| c["id"] == "longest")
        .expect("completed");
    assert_eq!(longest["completion_tokens"], 6, "{longest}");
    assert_eq!(done.len(), 3);
}

#[test]
fn a_batch_line_with_both_token_fields_gets_the_one_chat_reads() {
    let w = World::new();
    context_8192(&w);
    let prompts = w.fleet.path().join("batch.jsonl");
    let line = |id: &str, max_tokens: u32, max_completion_tokens: u32| {
        json!({"custom_id": id, "method": "POST", "url": "/v1/chat/completions",
               "body": {"messages": [{"role": "user", "content": format!("Question {id}")}],
                        "max_tokens": max_tokens, "max_completion_tokens": max_completion_tokens}})
        .to_string()
    };
    write_lines(
        &prompts,
        &[line("small", 2000, 50), line("huge", 100, 9000)],
    );
    let out = w.fleet.path().join("out");
    let (code, stderr) = generate(&w, &prompts, &out, &["--output-format", "fleet"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(failures(&out).is_empty(), "{:?}", failures(&out));
    let done = completions(&out);
    let small = done.iter().find(|c| c["id"] == "small").unwrap();
    assert_eq!(
        small["completion_tokens"], 50,
        "max_completion_tokens wins: {small}"
    );
    assert_eq!(small["finish_reason"], "length");
    assert!(done.iter().any(|c| c["id"] == "huge"));
}

#[test]
fn a_ten_second_load_through_ssh_and_pct_is_quiet_and_status_says_loading() {
    let sshd = common::Sshd::start();
    let home = sshd.home("pve");
    let ports = common::reserve_ports(2);
    let port_base = ports.base;
    home.write_inventory(
        "hosts:\n  - name: ct200\n    ssh: pve\n    container: 200\n    address: 127.0.0.1\n    gpus: [0, 1]\n",
    );
    std::fs::create_dir_all(home.path().join("profiles")).unwrap();
    std::fs::write(
        home.path().join("profiles/slow.yaml"),
        format!(
            "model: /models/test\nlauncher: [{SIM}]\nport_base: {port_base}\nserver:\n  \
             mamba_strategy: no_buffer\nenv:\n  SGLANG_SIM_STARTUP_SECS: \"10\"\n",
        ),
    )
    .unwrap();
    let run_dir = home.path().join("run");
    let fleet = || {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_fleet"));
        c.env("HOME", home.path())
            .env("FLEET_RUN_DIR", &run_dir)
            .env_remove("SSH_AUTH_SOCK")
            .env_remove("FLEET_CONFIG")
            .env_remove("FLEET_LOG")
            .current_dir(home.path())
            .stdin(Stdio::null());
        c
    };
    let up = fleet()
        .args(["up", "--profile", "slow"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // While the model loads the port is closed; the live process reads as loading.
    let t0 = Instant::now();
    let loading = loop {
        let out = fleet().args(["status", "--json"]).output().unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        if let Some(rows) = v.as_array()
            && rows.len() == 2
        {
            break rows
                .iter()
                .all(|r| r["state"] == "loading" && r["port_closed"] == true);
        }
        assert!(
            t0.elapsed() < Duration::from_secs(8),
            "no records while loading"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(loading, "status during the load");
    let out = up.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("WARN"), "a quiet load: {stderr}");
    assert_eq!(
        stderr.lines().filter(|l| l.contains("ready after")).count(),
        2,
        "{stderr}"
    );
    let down = fleet().args(["down", "--grace", "5s"]).output().unwrap();
    assert!(down.status.success());
}
