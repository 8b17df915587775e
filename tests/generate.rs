//! `fleet generate` and `fleet progress` through the real binary against in-process SGLang
//! stand-ins: exactly-once output, crash and resume, overflow, faults, malformed input, schema.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::generate::*;
use common::watch::Watch;
use rand::Rng;
use serde_json::json;

#[test]
fn two_thousand_prompts_exactly_once_over_two_instances() {
    let a = start_stub(StubSpec::default());
    let b = start_stub(StubSpec::default());
    let (_tmp, prompts, out) = prompts_and_out(2000);
    let o = generate(&out, &prompts, &[&a.url, &b.url])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_exactly_once(&out, 2000);
    assert!(failures(&out).is_empty());

    let lines = completions(&out);
    let first = lines.iter().find(|l| l["id"] == "p7").unwrap();
    assert_eq!(first["output"], "echo:prompt number 7");
    assert_eq!(first["prompt_tokens"], 3);
    assert_eq!(first["completion_tokens"], 7);
    assert_eq!(first["finish_reason"], "length");
    assert!(first["latency_s"].as_f64().unwrap() >= 0.0);
    // Both instances did real work.
    let on_a = lines
        .iter()
        .filter(|l| l["instance"].as_str() == Some(&a.url[7..]))
        .count();
    assert!(
        on_a > 200 && on_a < 1800,
        "instance a served {on_a} of 2000"
    );

    let p = progress(&out);
    let keys: Vec<&str> = {
        let mut k: Vec<&str> = p.as_object().unwrap().keys().map(String::as_str).collect();
        k.sort();
        k
    };
    assert_eq!(
        keys,
        [
            "avg_output_tokens",
            "completed",
            "elapsed_hours",
            "eta_high_hours",
            "eta_hours",
            "eta_low_hours",
            "expected_output_tokens",
            "failed",
            "instances",
            "length_estimate",
            "output_tok_s",
            "rate_per_sec",
            "s3_bytes",
            "s3_uploaded",
            "status",
            "total",
            "total_input_tokens",
            "total_output_tokens",
            "waiting_retry"
        ]
    );
    assert_eq!(p["status"], "done");
    assert_eq!(
        (
            p["total"].as_u64(),
            p["completed"].as_u64(),
            p["failed"].as_u64()
        ),
        (Some(2000), Some(2000), Some(0))
    );
    assert_eq!(p["total_output_tokens"], 14000);
    assert_eq!(p["avg_output_tokens"], 7);
    assert_eq!(p["eta_hours"], 0.0);
    assert_eq!(p["s3_uploaded"], 0);
    let inst = &p["instances"][0];
    for k in [
        "name",
        "url",
        "healthy",
        "in_flight",
        "concurrency",
        "rate_per_sec",
        "output_tok_s",
        "completed",
    ] {
        assert!(inst.get(k).is_some(), "instances[0] lacks {k}: {inst}");
    }
    // Auto concurrency starts at the server's cap plus a margin.
    assert_eq!(inst["server_cap"], 8);
    assert!(inst["concurrency"].as_u64().unwrap() >= 10);

    let o = fleet().arg("progress").arg(&out).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success());
    assert!(
        text.contains("status      done") && text.contains("2000/2000 (100.0%)"),
        "{text}"
    );
    let o = fleet()
        .args(["--json", "progress"])
        .arg(&out)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["completed"], 2000);

    // A finished directory is not overwritten by accident, and --resume has nothing left to do.
    let o = generate(&out, &prompts, &[&a.url]).output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("--resume"));
    let before = a.state.requests.load(std::sync::atomic::Ordering::SeqCst);
    let o = generate(&out, &prompts, &[&a.url])
        .arg("--resume")
        .output()
        .unwrap();
    assert!(o.status.success());
    assert_eq!(
        a.state.requests.load(std::sync::atomic::Ordering::SeqCst),
        before
    );
    assert_exactly_once(&out, 2000);
}

#[test]
fn killed_at_random_points_then_resumed_gives_exactly_once() {
    let spec = StubSpec {
        latency: Duration::from_millis(15),
        ..StubSpec::default()
    };
    let a = start_stub(spec.clone());
    let b = start_stub(spec);
    let (_tmp, prompts, out) = prompts_and_out(2000);
    let mut rng = rand::rng();
    let mut done_before = 0;
    for round in 0..6 {
        // Killed once this round has written a random number of lines, none included: in the
        // start-up and recovery, or at any point of the writes.
        let kill_at = lines_written(&out) + rng.random_range(0..200);
        let mut child = generate(&out, &prompts, &[&a.url, &b.url])
            .args(["--concurrency", "6"])
            .args(if round > 0 {
                &["--resume"][..]
            } else {
                &[][..]
            })
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let t0 = std::time::Instant::now();
        while lines_written(&out) < kill_at {
            assert!(
                child.try_wait().unwrap().is_none(),
                "round {round}: it ended"
            );
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "round {round}: no progress"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        // Whatever was written is readable (no torn line survives a resume), nothing twice.
        let counts = id_counts_after_recovery(&out);
        assert!(
            counts.values().all(|c| *c == 1),
            "round {round}: an id was written twice"
        );
        assert!(
            counts.len() >= done_before,
            "round {round}: lost written lines"
        );
        done_before = counts.len();
    }
    assert!(
        done_before < 2000,
        "the kills came too late to test anything"
    );
    let o = generate(&out, &prompts, &[&a.url, &b.url])
        .arg("--resume")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_exactly_once(&out, 2000);
    let p = progress(&out);
    assert_eq!(
        (p["completed"].as_u64(), p["status"].as_str()),
        (Some(2000), Some("done"))
    );
}

/// Id counts as a resume would see them: a torn tail (a kill during a write) is ignored.
fn id_counts_after_recovery(dir: &std::path::Path) -> std::collections::HashMap<String, usize> {
    let mut counts = std::collections::HashMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return counts;
    };
    for e in entries {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        if !(name.starts_with("completions-") || name == "failed.jsonl") {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        let whole = match text.rfind('\n') {
            Some(i) => &text[..=i],
            None => "",
        };
        for l in whole.lines() {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            *counts
                .entry(v["id"].as_str().unwrap().to_string())
                .or_insert(0) += 1;
        }
    }
    counts
}

#[test]
fn overflow_is_clamped_once_and_a_prompt_that_cannot_fit_is_recorded() {
    let stub = start_stub(StubSpec {
        context_len: 1000,
        ..StubSpec::default()
    });
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("prompts.jsonl");
    write_lines(
        &prompts,
        &[
            json!({"id": "fits", "prompt": "TOKENS=100 short"}).to_string(),
            json!({"id": "clamp", "prompt": "TOKENS=600 long"}).to_string(),
            json!({"id": "too-long", "prompt": "TOKENS=1200 huge"}).to_string(),
            json!({"id": "edge", "prompt": "TOKENS=999 edge"}).to_string(),
            json!({"id": "chat-clamp", "messages": [{"role": "user", "content": "TOKENS=700 c"}]})
                .to_string(),
        ],
    );
    let out = tmp.path().join("out");
    let o = generate(&out, &prompts, &[&stub.url])
        .args(["--max-tokens", "512"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "failures make the exit code 1");
    let done: Vec<String> = completions(&out)
        .iter()
        .map(|l| l["id"].as_str().unwrap().to_string())
        .collect();
    let mut done_sorted = done.clone();
    done_sorted.sort();
    assert_eq!(done_sorted, ["chat-clamp", "clamp", "fits"]);
    let failed = failures(&out);
    assert_eq!(failed.len(), 2);
    for f in &failed {
        assert_eq!(f["reason"], "prompt_too_long", "{f}");
    }
    let too_long = failed.iter().find(|f| f["id"] == "too-long").unwrap();
    assert_eq!(too_long["line"], 3);
    assert!(too_long["error"].as_str().unwrap().contains("1200"));
    // 600 + 512 > 1000: retried with 1000 - 600 - 1 = 399.
    let seen = stub.state.seen.lock().unwrap().clone();
    assert!(
        seen.contains(&(600, 512)) && seen.contains(&(600, 399)),
        "{seen:?}"
    );
    assert!(seen.contains(&(700, 299)), "{seen:?}");
    assert_eq!(
        seen.iter().filter(|(p, _)| *p == 1200).count(),
        1,
        "a prompt that cannot fit is not retried"
    );
}

#[test]
fn malformed_lines_are_recorded_and_the_run_goes_on() {
    let stub = start_stub(StubSpec::default());
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("prompts.jsonl");
    write_lines(
        &prompts,
        &[
            json!({"id": "a", "prompt": "one"}).to_string(),
            "{not json".to_string(),
            String::new(),
            json!({"id": "b", "prompt": 42}).to_string(),
            json!({"prompt": "no id"}).to_string(),
            json!({"custom_id": "batch-1", "method": "POST", "url": "/v1/chat/completions",
                   "body": {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}})
            .to_string(),
        ],
    );
    let out = tmp.path().join("out");
    let o = generate(&out, &prompts, &[&stub.url]).output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("line 2") && stderr.contains("line 4"),
        "{stderr}"
    );
    let mut ids: Vec<String> = completions(&out)
        .iter()
        .map(|l| l["id"].to_string())
        .collect();
    ids.sort();
    assert_eq!(ids[..2], ["\"a\"", "\"batch-1\""]);
    // A line without an id is named after its content, not its place in the file.
    let named = json!({"prompt": "no id"}).to_string();
    let hash = sha256_16(&named);
    assert_eq!(ids[2], format!("\"sha256:{hash}\""), "{ids:?}");
    let failed = failures(&out);
    assert_eq!(failed.len(), 2);
    assert_eq!(
        (failed[0]["id"].clone(), failed[0]["line"].clone()),
        (
            json!(format!("sha256:{}", sha256_16("{not json"))),
            json!(2)
        )
    );
    assert_eq!(failed[0]["reason"], "malformed_line");
    assert_eq!(failed[1]["id"], "b");
    assert!(
        failed[1]["error"]
            .as_str()
            .unwrap()
            .contains("must be a string")
    );
    let batch = completions(&out)
        .into_iter()
        .find(|l| l["id"] == "batch-1")
        .unwrap();
    assert_eq!(batch["output"], "chat:hi");
    assert_eq!(
        stub.state
            .seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, m)| *m == 5)
            .count(),
        1
    );
}

#[test]
fn a_duplicate_id_is_an_error_before_any_request() {
    let stub = start_stub(StubSpec::default());
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("prompts.jsonl");
    write_lines(
        &prompts,
        &[
            json!({"id": "a", "prompt": "1"}).to_string(),
            json!({"id": "b", "prompt": "2"}).to_string(),
            json!({"id": "a", "prompt": "3"}).to_string(),
        ],
    );
    let out = tmp.path().join("out");
    let o = generate(&out, &prompts, &[&stub.url]).output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_ne!(o.status.code(), Some(0));
    assert!(
        stderr.contains("duplicate id \"a\" on lines 1 and 3"),
        "{stderr}"
    );
    assert_eq!(
        stub.state
            .requests
            .load(std::sync::atomic::Ordering::SeqCst),
        0
    );
}

#[test]
fn retryable_errors_are_retried_and_exhausted_ones_recorded() {
    // Every 5th request fails with 503: all prompts still complete with retries.
    let flaky = start_stub(StubSpec {
        fail_every: Some(5),
        ..StubSpec::default()
    });
    let (tmp, prompts, out) = prompts_and_out(200);
    let o = generate(&out, &prompts, &[&flaky.url])
        .args(["--max-retries", "10"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_exactly_once(&out, 200);
    assert!(failures(&out).is_empty());
    assert!(
        flaky
            .state
            .requests
            .load(std::sync::atomic::Ordering::SeqCst)
            >= 249
    );

    // Every request fails: each prompt is tried 1 + max-retries times, then kept for a
    // resume: a server's 503 is not the prompt's fault, so nothing is failed for good.
    let broken = start_stub(StubSpec {
        fail_every: Some(1),
        ..StubSpec::default()
    });
    let out = tmp.path().join("out2");
    write_prompts(&prompts, 3);
    let o = generate(&out, &prompts, &[&broken.url])
        .args(["--max-retries", "2"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("3 prompts are waiting for a retry"),
        "{stderr}"
    );
    assert!(failures(&out).is_empty());
    let waiting = retries(&out);
    assert_eq!(waiting.len(), 3);
    assert_eq!(waiting[0]["reason"], "retries_exhausted");
    assert!(
        waiting[0]["error"].as_str().unwrap().contains("503"),
        "{}",
        waiting[0]
    );
    let p = progress(&out);
    assert_eq!(
        (p["failed"].as_u64(), p["waiting_retry"].as_u64()),
        (Some(0), Some(3))
    );
    assert_eq!(
        broken
            .state
            .requests
            .load(std::sync::atomic::Ordering::SeqCst),
        9
    );
    // The servers are well again: --resume sends the three, and each is written once.
    let o = generate(&out, &prompts, &[&flaky.url])
        .arg("--resume")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_exactly_once(&out, 3);
    assert!(retries(&out).is_empty());
}

#[test]
fn bad_arguments_are_usage_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("p.jsonl");
    write_prompts(&prompts, 1);
    let out = tmp.path().join("out");
    let o = generate(&out, &prompts, &["http://127.0.0.1:1"])
        .args(["--concurrency", "lots"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr)
            .contains("--concurrency must be `auto` or a positive number")
    );
    let o = generate(
        &out,
        &tmp.path().join("missing.jsonl"),
        &["http://127.0.0.1:1"],
    )
    .output()
    .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("missing.jsonl: no such file"));
    // Nothing listens on port 1: a clear error naming the URL, exit 3.
    let o = generate(&out, &prompts, &["http://127.0.0.1:1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("no instance answered") && stderr.contains("127.0.0.1:1"),
        "{stderr}"
    );
}

#[test]
fn ctrl_c_finishes_in_flight_writes_everything_and_exits_130() {
    interrupted_then_resumed(libc::SIGINT, 130);
}

/// systemd stopping a unit, `kill`: the same wind-down as Ctrl-C.
#[test]
fn sigterm_finishes_in_flight_writes_everything_and_exits_143() {
    interrupted_then_resumed(libc::SIGTERM, 143);
}

/// A closed terminal, `tmux kill-session`.
#[test]
fn sighup_finishes_in_flight_writes_everything_and_exits_129() {
    interrupted_then_resumed(libc::SIGHUP, 129);
}

fn interrupted_then_resumed(signal: i32, code: i32) {
    let stub = start_stub(StubSpec {
        latency: Duration::from_millis(300),
        cap: 4,
        ..StubSpec::default()
    });
    let (_tmp, prompts, out) = prompts_and_out(200);
    let child = generate(&out, &prompts, &[&stub.url])
        .args(["--concurrency", "4", "--grace", "10s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Under way: its first requests answered, the next ones in flight.
    stub.wait_requests(8);
    let sent_before = stub.requests();
    // SAFETY: signalling the child this test spawned, by its pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
    let o = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(code), "{stderr}");
    assert!(stderr.contains("--resume"), "{stderr}");
    let p = progress(&out);
    assert_eq!(p["status"], "interrupted");
    // Requests already sent were waited for and written; none were started after Ctrl-C.
    let written = completions(&out).len() as u64;
    let sent = stub.requests();
    assert!(
        sent <= sent_before + 4,
        "dispatching went on after Ctrl-C: {sent_before} then {sent}"
    );
    assert_eq!(
        written, sent,
        "every request in flight at Ctrl-C was written"
    );
    assert_eq!(p["completed"].as_u64(), Some(written));
    assert!(written < 200);

    let o = generate(&out, &prompts, &[&stub.url])
        .args(["--resume", "--concurrency", "64"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_exactly_once(&out, 200);
}

/// `fleet generate ... 2>&1 | head -2`: the reader leaves after two lines, and the job goes on
/// to the end with every prompt written once.
#[test]
fn a_closed_output_pipe_does_not_stop_the_job() {
    use std::io::BufRead;
    let stub = start_stub(StubSpec {
        latency: Duration::from_millis(20),
        cap: 8,
        ..StubSpec::default()
    });
    let (_tmp, prompts, out) = prompts_and_out(300);
    let (reader, writer) = std::io::pipe().unwrap();
    let mut child = generate(&out, &prompts, &[&stub.url])
        .args(["-v", "--concurrency", "8"])
        .stdout(writer.try_clone().unwrap())
        .stderr(writer)
        .spawn()
        .unwrap();
    let mut head = std::io::BufReader::new(reader);
    for _ in 0..2 {
        let mut line = String::new();
        assert!(head.read_line(&mut line).unwrap() > 0, "fewer than 2 lines");
    }
    drop(head);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "the job ended with {status}");
    assert_eq!(progress(&out)["status"], "done");
    assert_exactly_once(&out, 300);
}

#[test]
fn watchdog_names_a_client_that_is_too_slow_and_abort_below_stops_the_run() {
    let stub = start_stub(StubSpec {
        latency: Duration::from_millis(20),
        cap: 64,
        ..StubSpec::default()
    });
    let (_tmp, prompts, out) = prompts_and_out(2000);
    let o = generate(&out, &prompts, &[&stub.url])
        .args([
            "--concurrency",
            "2",
            "--warmup",
            "2s",
            "--abort-below",
            "0.5",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("WATCHDOG"), "{stderr}");
    assert!(
        // How many the server saw running depends on when /metrics was read; the client's
        // limit does not.
        stderr.contains("in-flight limit 2") && stderr.contains("client is too slow"),
        "{stderr}"
    );
    assert!(stderr.contains("stopped by --abort-below"), "{stderr}");
    let p = progress(&out);
    assert_eq!(p["status"], "failed");
    let done = completions(&out).len();
    assert!(done > 0 && done < 2000, "{done}");
    // What was written stays valid and the job resumes to completion.
    let o = generate(&out, &prompts, &[&stub.url])
        .arg("--resume")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_exactly_once(&out, 2000);
}

#[test]
fn a_dying_instance_is_taken_out_its_requests_go_elsewhere_and_it_comes_back() {
    let spec = StubSpec {
        latency: Duration::from_millis(20),
        ..StubSpec::default()
    };
    let a = start_stub(spec.clone());
    let b = start_stub(spec);
    let (_tmp, prompts, out) = prompts_and_out(3000);
    let mut child = generate(&out, &prompts, &[&a.url, &b.url])
        .args(["--max-retries", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let watch = Watch::stderr(&mut child);
    b.wait_requests(50);
    b.stop();
    let b_name = &b.url[7..];
    watch.wait_for(&format!("{b_name} taken out"), 1, Duration::from_secs(60));
    let b_before = b.requests();
    b.start();
    let status = child.wait().unwrap();
    let stderr = watch.finish();
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("{b_name} is healthy again")),
        "{stderr}"
    );
    // Nothing lost and nothing failed, even with no retries allowed: a dead server's requests
    // are re-dispatched, not retried.
    assert_exactly_once(&out, 3000);
    assert!(failures(&out).is_empty());
    let b_after = b.requests() - b_before;
    assert!(
        b_after > 100,
        "b served {b_after} requests after coming back"
    );
}

#[test]
fn all_instances_down_pauses_then_resumes_or_gives_up_after_the_stall_timeout() {
    let spec = StubSpec {
        latency: Duration::from_millis(10),
        ..StubSpec::default()
    };
    let a = start_stub(spec);
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("prompts.jsonl");
    write_prompts(&prompts, 1000);

    // Back within the stall timeout: the run pauses, then finishes.
    let out = tmp.path().join("out");
    let mut child = generate(&out, &prompts, &[&a.url])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let watch = Watch::stderr(&mut child);
    a.wait_requests(50);
    a.stop();
    watch.wait_for("paused: no instance is healthy", 1, Duration::from_secs(60));
    a.start();
    let status = child.wait().unwrap();
    let stderr = watch.finish();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("resuming"), "{stderr}");
    assert_exactly_once(&out, 1000);

    // Not back: give up after --stall-timeout, keep what was written.
    let out = tmp.path().join("out2");
    let before = a.requests();
    let child = generate(&out, &prompts, &[&a.url])
        .args(["--stall-timeout", "2s"])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    a.wait_requests(before + 50);
    a.stop();
    let o = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    // An outage interrupts the job; it does not fail it, or any prompt.
    assert_eq!(o.status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains("no instance was healthy for --stall-timeout (2s)"),
        "{stderr}"
    );
    assert_eq!(progress(&out)["status"], "interrupted");
    assert!(failures(&out).is_empty() && retries(&out).is_empty());
    a.start();
    let o = generate(&out, &prompts, &[&a.url])
        .arg("--resume")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_exactly_once(&out, 1000);
}

/// The first 16 hex digits of the SHA-256 of `text`, as fleet names a line without an id.
fn sha256_16(text: &str) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(text.as_bytes());
    d[..8].iter().map(|b| format!("{b:02x}")).collect()
}
