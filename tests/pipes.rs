//! Output into a closed pipe (`fleet status | head -1` once head has left) through the real
//! binary: every command stops printing quietly and exits with its normal code, never the
//! "failed printing to stdout: Broken pipe" panic (exit 101), and a running job is not killed.
//! The pipe's read end is closed before fleet starts, so its first write fails for certain.

mod common;

use std::process::{Command, Output, Stdio};

use common::local_fleet::LocalFleet;

/// The write end of a pipe nobody reads.
fn closed() -> Stdio {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    Stdio::from(writer)
}

/// Runs `cmd` with stdout into a closed pipe; stderr is kept.
fn into_closed_stdout(cmd: &mut Command) -> Output {
    cmd.stdout(closed()).stderr(Stdio::piped());
    let out = cmd.output().unwrap();
    assert_no_panic(&out);
    out
}

fn assert_no_panic(out: &Output) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
        "{stderr}"
    );
    assert_ne!(out.status.code(), Some(101), "{stderr}");
}

fn fleet() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fleet"));
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("FLEET_CONFIG")
        .env_remove("FLEET_PROFILES_DIR")
        .env_remove("FLEET_LOG")
        .stdin(Stdio::null());
    cmd
}

#[test]
fn completions_and_profiles_into_a_closed_pipe_exit_quietly() {
    for args in [
        &["completions", "bash"][..],
        &["completions", "zsh"],
        &["profile", "show", "blackwell-no-buffer"],
        &["--json", "profile", "show", "blackwell-no-buffer"],
        &[
            "profile",
            "check",
            "blackwell-no-buffer",
            "blackwell-extra-buffer",
        ],
    ] {
        let out = into_closed_stdout(fleet().args(args));
        assert_eq!(out.status.code(), Some(0), "{args:?}");
    }
    // A usage error still says what is wrong on stderr, with its own exit code.
    let out = into_closed_stdout(fleet().args(["profile", "show", "nope"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("profile `nope` not found"));
}

#[test]
fn a_fleet_started_stopped_and_shown_into_closed_pipes_still_works() {
    let f = LocalFleet::new(2);
    let ports = common::reserve_ports(2);
    f.write_profile(
        "sim",
        &format!(
            "model: /models/test\nlauncher: [sglang-sim]\nport_base: {}\n\
             env:\n  SGLANG_SIM_STARTUP_SECS: \"1\"\n  SGLANG_SIM_GPU_STATE_DIR: \"{}\"\n\
             health: {{startup_timeout: 60s, poll: 1s}}\n",
            ports.base,
            f.gpu_state().display()
        ),
    );
    // `up`'s table has no reader: the servers start and are recorded all the same.
    let out = into_closed_stdout(f.command().args(["up", "--profile", "sim"]));
    assert_eq!(out.status.code(), Some(0));
    for args in [
        &["status"][..],
        &["--json", "status"],
        &["gpus"],
        &["--json", "gpus"],
        &["logs", "local:0"],
        &["logs", "local:0", "-f"],
        &["down", "--dry-run"],
    ] {
        let out = into_closed_stdout(f.command().args(args));
        assert_eq!(out.status.code(), Some(0), "{args:?}");
    }
    let shown = f.fleet().args(["--json", "status"]).output().unwrap();
    let status: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(status.as_array().unwrap().len(), 2, "still running");

    // Logs on a closed stderr are dropped too; the table still reaches stdout.
    let out = f
        .command()
        .args(["-vv", "status"])
        .stdout(Stdio::piped())
        .stderr(closed())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("GEN TOK/S"));

    let out = into_closed_stdout(f.command().args(["down", "--grace", "5s"]));
    assert_eq!(out.status.code(), Some(0));
    let shown = f.fleet().args(["--json", "status"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&shown.stdout).trim(), "[]");
}
