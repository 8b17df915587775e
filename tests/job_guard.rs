//! One output directory, one job, its data guarded, through the real binary: two runs on one
//! `--out`, a resume over a changed input, an input that grows or shrinks mid-run, odd bytes and
//! big ids, prompts fixed by hand and `--retry-failed`, and inputs or outputs that cannot work.
//! Each test checks what a user would: every input id exactly once, or the exact refusal.

mod common;

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::generate::*;
use serde_json::{Value, json};
use sha2::Digest;

/// A stand-in slow enough that a job lasts a few seconds.
fn slow_stub() -> Stub {
    start_stub(StubSpec {
        latency: Duration::from_millis(20),
        ..StubSpec::default()
    })
}

fn spawn(out: &Path, prompts: &Path, url: &str, extra: &[&str]) -> Child {
    generate(out, prompts, &[url])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn stderr_of(child: Child) -> (Option<i32>, String) {
    let o = child.wait_with_output().unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Waits until the job in `out` has written at least `n` completions.
fn wait_for(out: &Path, n: u64) {
    let t0 = Instant::now();
    while std::fs::read_to_string(out.join("progress.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|p| p["completed"].as_u64())
        .unwrap_or(0)
        < n
    {
        assert!(t0.elapsed() < Duration::from_secs(60), "no progress");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn run(out: &Path, prompts: &Path, url: &str, extra: &[&str]) -> (Option<i32>, String) {
    stderr_of(spawn(out, prompts, url, extra))
}

/// What fleet names a line without an id: its content's SHA-256, 16 hex digits.
fn content_id(line: &str) -> String {
    let d = sha2::Sha256::digest(line.as_bytes());
    let hex: String = d[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

#[test]
fn a_second_run_on_the_same_out_is_refused_naming_who_holds_it() {
    let stub = slow_stub();
    let (_tmp, prompts, out) = prompts_and_out(1500);
    let first = spawn(&out, &prompts, &stub.url, &[]);
    wait_for(&out, 10);
    for extra in [&[][..], &["--resume"][..]] {
        let (code, stderr) = run(&out, &prompts, &stub.url, extra);
        assert_eq!(code, Some(2), "{stderr}");
        assert!(
            stderr.contains("is in use by another fleet job (pid ")
                && stderr.contains(&format!("pid {}", first.id())),
            "{stderr}"
        );
    }
    let (code, stderr) = stderr_of(first);
    assert_eq!(code, Some(0), "{stderr}");
    assert_exactly_once(&out, 1500);
    // The lock went with the first run: a resume finds nothing left to do.
    let (code, stderr) = run(&out, &prompts, &stub.url, &["--resume"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_exactly_once(&out, 1500);
}

#[test]
fn a_resume_over_another_input_is_refused_and_allow_changed_input_keys_by_id() {
    let stub = start_stub(StubSpec::default());
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("prompts.jsonl");
    // Lines without ids, interrupted halfway: a deleted line must not shift the others' ids.
    let lines: Vec<String> = (0..600)
        .map(|i| json!({"prompt": format!("question {i}")}).to_string())
        .collect();
    write_lines(&prompts, &lines);
    let out = tmp.path().join("out");
    let (code, stderr) = run(&out, &prompts, &stub.url, &["--limit", "300"]);
    assert_eq!(code, Some(0), "{stderr}");
    let mut edited = lines.clone();
    edited.remove(4);
    write_lines(&prompts, &edited);
    let (code, stderr) = run(&out, &prompts, &stub.url, &["--resume", "--limit", "300"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("holds a job over another input")
            && stderr.contains("the ids differ")
            && stderr.contains("--allow-changed-input"),
        "{stderr}"
    );
    let (code, stderr) = run(
        &out,
        &prompts,
        &stub.url,
        &["--resume", "--allow-changed-input"],
    );
    assert_eq!(code, Some(0), "{stderr}");
    // Every line of the input has exactly its own completion.
    let done = completions(&out);
    for line in &edited {
        let id = content_id(line);
        let mine: Vec<&Value> = done.iter().filter(|c| c["id"] == id.as_str()).collect();
        assert_eq!(mine.len(), 1, "{line}");
        let prompt: Value = serde_json::from_str(line).unwrap();
        assert_eq!(
            mine[0]["output"],
            format!("echo:{}", prompt["prompt"].as_str().unwrap())
        );
    }
    let p = progress(&out);
    assert_eq!(
        (p["total"].as_u64(), p["completed"].as_u64()),
        (Some(599), Some(599))
    );
}

#[test]
fn a_swapped_input_is_refused_with_what_changed() {
    let stub = start_stub(StubSpec::default());
    let (tmp, prompts, out) = prompts_and_out(100);
    let (code, stderr) = run(&out, &prompts, &stub.url, &[]);
    assert_eq!(code, Some(0), "{stderr}");
    let other = tmp.path().join("other.jsonl");
    let lines: Vec<String> = (0..161)
        .map(|i| json!({"id": format!("x{i}"), "prompt": "other"}).to_string())
        .collect();
    write_lines(&other, &lines);
    let (code, stderr) = run(&out, &other, &stub.url, &["--resume"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("100 prompt lines, now 161"), "{stderr}");
    assert_exactly_once(&out, 100);
}

#[test]
fn lines_appended_mid_run_are_left_out_and_counted_nowhere() {
    let stub = slow_stub();
    let (_tmp, prompts, out) = prompts_and_out(1200);
    let job = spawn(&out, &prompts, &stub.url, &[]);
    wait_for(&out, 10);
    let extra: Vec<String> = (0..50)
        .map(|i| json!({"id": format!("p{i}"), "prompt": "a duplicate id, appended"}).to_string())
        .collect();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&prompts)
        .unwrap();
    std::io::Write::write_all(&mut f, (extra.join("\n") + "\n").as_bytes()).unwrap();
    drop(f);
    let (code, stderr) = stderr_of(job);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("were appended to the prompts after the job began"),
        "{stderr}"
    );
    assert_exactly_once(&out, 1200);
    let p = progress(&out);
    assert_eq!(
        (p["total"].as_u64(), p["completed"].as_u64()),
        (Some(1200), Some(1200))
    );
}

#[test]
fn an_input_that_shrinks_mid_run_fails_the_job_with_why() {
    let stub = slow_stub();
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("prompts.jsonl");
    // Far more lines than the reader runs ahead of the job, so it is still far from the end
    // when the file is cut.
    let lines: Vec<String> = (0..20_000)
        .map(|i| json!({"id": format!("p{i}"), "prompt": format!("prompt {i}")}).to_string())
        .collect();
    write_lines(&prompts, &lines);
    let out = tmp.path().join("out");
    let job = spawn(&out, &prompts, &stub.url, &[]);
    wait_for(&out, 5);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&prompts)
        .unwrap();
    let len = f.metadata().unwrap().len();
    f.set_len(len * 6 / 10).unwrap();
    drop(f);
    let (code, stderr) = stderr_of(job);
    assert_eq!(code, Some(3), "{stderr}");
    assert!(
        stderr.contains("the file shrank while the job ran"),
        "{stderr}"
    );
    let p = progress(&out);
    assert_eq!(p["status"], "failed");
    assert!(p["completed"].as_u64().unwrap() < 20_000);
}

#[test]
fn invalid_utf8_fails_one_line_and_a_bom_is_skipped() {
    let stub = start_stub(StubSpec::default());
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("prompts.jsonl");
    let mut bytes = b"\xEF\xBB\xBF{\"id\":\"first\",\"prompt\":\"with a BOM\"}\n".to_vec();
    bytes.extend_from_slice(b"{\"id\":\"bad\",\"prompt\":\"\xff\xfe\"}\n");
    bytes.extend_from_slice(b"{\"id\":\"last\",\"prompt\":\"fine\"}\n");
    std::fs::write(&prompts, bytes).unwrap();
    let out = tmp.path().join("out");
    let (code, stderr) = run(&out, &prompts, &stub.url, &[]);
    assert_eq!(code, Some(1), "one prompt failed: {stderr}");
    assert!(stderr.contains("line 2: not valid UTF-8"), "{stderr}");
    let done: Vec<String> = completions(&out)
        .iter()
        .map(|c| c["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(done.len(), 2);
    assert!(done.contains(&"first".to_string()) && done.contains(&"last".to_string()));
    let failed = failures(&out);
    assert_eq!(failed.len(), 1);
    assert_eq!(
        (failed[0]["line"].as_u64(), failed[0]["reason"].as_str()),
        (Some(2), Some("malformed_line"))
    );
}

#[test]
fn big_integer_ids_stay_distinct_and_exact() {
    let stub = start_stub(StubSpec::default());
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("prompts.jsonl");
    std::fs::write(
        &prompts,
        "{\"id\": 12345678901234567890123, \"prompt\": \"a\"}\n\
         {\"id\": 12345678901234567890124, \"prompt\": \"b\"}\n\
         [\"an\", \"array\", \"is\", \"no\", \"prompt\", \"line\"]\n",
    )
    .unwrap();
    let out = tmp.path().join("out");
    let (code, stderr) = run(&out, &prompts, &stub.url, &[]);
    assert_eq!(code, Some(1), "{stderr}");
    let text = std::fs::read_to_string(out.join("completions-00000.jsonl")).unwrap();
    assert!(text.contains("{\"id\":12345678901234567890123,"), "{text}");
    assert!(text.contains("{\"id\":12345678901234567890124,"), "{text}");
    let failed = failures(&out);
    assert_eq!(failed[0]["error"], "a prompt line must be a JSON object");
}

#[test]
fn a_line_fixed_by_hand_is_sent_again_with_retry_failed() {
    let stub = start_stub(StubSpec::default());
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("prompts.jsonl");
    let good = |i: u32| json!({"id": format!("p{i}"), "prompt": "fine"}).to_string();
    let broken = json!({"id": "p2", "prompt": 42}).to_string();
    write_lines(&prompts, &[good(0), good(1), broken.clone(), good(3)]);
    let out = tmp.path().join("out");
    let (code, _) = run(&out, &prompts, &stub.url, &[]);
    assert_eq!(code, Some(1));
    assert_eq!(failures(&out).len(), 1);
    // Fixed: a plain resume keeps it failed (a prompt's own failure is final) ...
    write_lines(&prompts, &[good(0), good(1), good(2), good(3)]);
    let (code, stderr) = run(
        &out,
        &prompts,
        &stub.url,
        &["--resume", "--allow-changed-input"],
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(failures(&out).len(), 1);
    // ... and --retry-failed sends it again, since its line changed.
    let (code, stderr) = run(&out, &prompts, &stub.url, &["--resume", "--retry-failed"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(failures(&out).is_empty());
    assert_exactly_once(&out, 4);
    // `all` also resends a failure whose line did not change.
    write_lines(
        &prompts,
        &[
            good(0),
            good(1),
            good(2),
            good(3),
            broken.replace("p2", "p4"),
        ],
    );
    let (code, _) = run(
        &out,
        &prompts,
        &stub.url,
        &["--resume", "--allow-changed-input"],
    );
    assert_eq!(code, Some(1));
    let (code, _) = run(
        &out,
        &prompts,
        &stub.url,
        &["--resume", "--retry-failed", "all"],
    );
    assert_eq!(code, Some(1), "it fails again, for the same reason");
    assert_eq!(failures(&out).len(), 1);
    assert_eq!(id_counts(&out).get("p4"), Some(&1), "still exactly once");
}

#[test]
fn inputs_and_outputs_that_cannot_work_are_usage_errors_before_any_request() {
    let stub = start_stub(StubSpec::default());
    let (tmp, prompts, out) = prompts_and_out(3);
    let (code, stderr) = run(&out, Path::new("-"), &stub.url, &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("standard input cannot be used") && stderr.contains("regular file"),
        "{stderr}"
    );
    let fifo = tmp.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo(3) on a path in the test's own temp dir.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let (code, stderr) = run(&out, &fifo, &stub.url, &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("not a regular file (a pipe or a directory)"),
        "{stderr}"
    );
    let file = tmp.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let (code, stderr) = run(&file, &prompts, &stub.url, &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("not a directory"), "{stderr}");
    assert_eq!(
        stub.state
            .requests
            .load(std::sync::atomic::Ordering::SeqCst),
        0
    );
}
