//! `fleet profile show|check` through the real binary: every profile error class, the messages a
//! user reads, and exit codes.

use std::fs;
use std::path::Path;

use assert_cmd::Command;

const FIXTURES: &str = "tests/fixtures/config";

/// `fleet` run from the package root, with no inventory unless a test gives one.
fn fleet() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fleet"));
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("FLEET_CONFIG")
        .env_remove("FLEET_PROFILES_DIR");
    cmd.args(["--config", "tests/fixtures/config/no-such-inventory.yaml"]);
    cmd
}

/// `fleet profile check NAME` on a fixture: exit 2, stdout exactly `expected`.
fn check_fixture(name: &str, expected: &[&str]) {
    let out = fleet()
        .args(["--profiles-dir", FIXTURES, "profile", "check", name])
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        expected,
        "stdout:\n{stdout}"
    );
    assert!(
        stderr.contains("error: 1 of 1 checked files invalid"),
        "{stderr}"
    );
}

#[test]
fn unknown_keys_get_a_suggestion_or_the_known_keys() {
    check_fixture(
        "unknown-key",
        &[
            "tests/fixtures/config/unknown-key.yaml: 3 problems",
            "  tests/fixtures/config/unknown-key.yaml:4:3: server.mem_fraction_statc: unknown key (did you mean `mem_fraction_static`?)",
            "  tests/fixtures/config/unknown-key.yaml:5:3: server.tensor_parallel_size: unknown key (`--tensor-parallel-size` is `server.tp_size` in a profile)",
            "  tests/fixtures/config/unknown-key.yaml:6:1: context_length: unknown key (`context_length` belongs under `server:`)",
        ],
    );
}

#[test]
fn duplicate_keys_name_both_lines() {
    check_fixture(
        "duplicate-key",
        &[
            "tests/fixtures/config/duplicate-key.yaml: 1 problem",
            "  tests/fixtures/config/duplicate-key.yaml:5:3: server.context_length: duplicate key (first set on line 4; keep one of them)",
        ],
    );
}

#[test]
fn wrong_types_say_what_was_expected_and_found() {
    check_fixture(
        "wrong-type",
        &[
            "tests/fixtures/config/wrong-type.yaml: 5 problems",
            "  tests/fixtures/config/wrong-type.yaml:1:8: model: expected a string, found a list",
            "  tests/fixtures/config/wrong-type.yaml:2:11: launcher: expected a list (an argv), found the string `python3 -m sglang.launch_server` (write each word as an item, e.g. [/workspace/venv/bin/python, -m, sglang.launch_server])",
            "  tests/fixtures/config/wrong-type.yaml:3:12: port_base: expected an integer, found the string `30000` (write it without quotes)",
            "  tests/fixtures/config/wrong-type.yaml:5:19: server.enable_metrics: expected true or false, found the string `yes`",
            "  tests/fixtures/config/wrong-type.yaml:6:15: server.extra_args: expected a list, found the string `--trust-remote-code`",
        ],
    );
}

#[test]
fn values_out_of_range() {
    check_fixture(
        "out-of-range",
        &[
            "tests/fixtures/config/out-of-range.yaml: 5 problems",
            "  tests/fixtures/config/out-of-range.yaml:3:12: port_base: 70000 is out of range (must be 1..=65535)",
            "  tests/fixtures/config/out-of-range.yaml:5:24: server.mem_fraction_static: 1.0 is out of range (must be between 0 and 1 (exclusive), e.g. 0.85)",
            "  tests/fixtures/config/out-of-range.yaml:6:19: server.context_length: 0 is out of range (must be at least 1)",
            "  tests/fixtures/config/out-of-range.yaml:7:25: server.max_running_requests: 0 is out of range (must be at least 1)",
            "  tests/fixtures/config/out-of-range.yaml:9:25: expected.output_tok_s_per_gpu: 0.0 is out of range (must be above 0)",
        ],
    );
}

#[test]
fn an_empty_launcher_is_refused_with_an_example() {
    check_fixture(
        "empty-launcher",
        &[
            "tests/fixtures/config/empty-launcher.yaml: 1 problem",
            "  tests/fixtures/config/empty-launcher.yaml:2:11: launcher: must not be empty (the command that starts SGLang, e.g. [/workspace/venv/bin/python, -m, sglang.launch_server])",
        ],
    );
}

#[test]
fn bad_durations_show_the_expected_form() {
    check_fixture(
        "bad-duration",
        &[
            "tests/fixtures/config/bad-duration.yaml: 2 problems",
            "  tests/fixtures/config/bad-duration.yaml:4:20: health.startup_timeout: bad duration `twenty minutes`: expected number at 0 (use a number with a unit, e.g. 90s, 20m, 1h)",
            "  tests/fixtures/config/bad-duration.yaml:5:9: health.poll: a duration needs a unit (use a number with a unit, e.g. 90s, 20m, 1h)",
        ],
    );
}

#[test]
fn a_bad_mamba_strategy_lists_the_choices() {
    check_fixture(
        "bad-mamba",
        &[
            "tests/fixtures/config/bad-mamba.yaml: 1 problem",
            "  tests/fixtures/config/bad-mamba.yaml:4:19: server.mamba_strategy: unknown mamba strategy `no-buffer` (did you mean `no_buffer`? choose one of: auto, no_buffer, extra_buffer, extra_buffer_lazy)",
        ],
    );
}

#[test]
fn an_extends_cycle_names_the_chain() {
    check_fixture(
        "cycle-a",
        &[
            "tests/fixtures/config/cycle-a.yaml: 1 problem",
            "  tests/fixtures/config/cycle-c.yaml:1:10: extends: `extends:` cycle: tests/fixtures/config/cycle-a.yaml → tests/fixtures/config/cycle-b.yaml → tests/fixtures/config/cycle-c.yaml → tests/fixtures/config/cycle-a.yaml (a profile cannot extend itself, directly or through others)",
        ],
    );
}

#[test]
fn a_missing_extends_target_suggests_and_lists_profiles() {
    let out = fleet()
        .args([
            "--profiles-dir",
            FIXTURES,
            "profile",
            "check",
            "missing-extends",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(2));
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines[0],
        "tests/fixtures/config/missing-extends.yaml: 1 problem"
    );
    assert!(
        lines[1].starts_with(
            "  tests/fixtures/config/missing-extends.yaml:1:10: extends: profile `goood` not found: \
             no file at tests/fixtures/config/goood.yaml (did you mean `good`?); available: bad-duration, bad-mamba,"
        ),
        "{stdout}"
    );
    assert_eq!(lines.len(), 2, "{stdout}");
}

#[test]
fn several_problems_in_one_file_are_all_reported_and_secrets_are_not_echoed() {
    let out = fleet()
        .args([
            "--profiles-dir",
            FIXTURES,
            "profile",
            "check",
            "many-problems",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        [
            "tests/fixtures/config/many-problems.yaml: 8 problems",
            "  tests/fixtures/config/many-problems.yaml:4:20: served_model_name: must not be empty",
            "  tests/fixtures/config/many-problems.yaml:5:12: port_base: 0 is out of range (must be 1..=65535)",
            "  tests/fixtures/config/many-problems.yaml:7:24: server.mem_fraction_static: 2.0 is out of range (must be between 0 and 1 (exclusive), e.g. 0.85)",
            "  tests/fixtures/config/many-problems.yaml:8:19: server.mamba_strategy: unknown mamba strategy `fast` (choose one of: auto, no_buffer, extra_buffer, extra_buffer_lazy)",
            "  tests/fixtures/config/many-problems.yaml:9:16: server.extra_args[0]: `--port` is set by fleet (use `port_base` instead)",
            "  tests/fixtures/config/many-problems.yaml:12:3: env.NCCL-DEBUG: not an environment variable name (use letters, digits and _, not starting with a digit)",
            "  tests/fixtures/config/many-problems.yaml:13:12: env.VERSION: expected a string, found the number 1.1 (quote it, e.g. \"1.10\")",
            "  tests/fixtures/config/many-problems.yaml:14:14: api_key_env: must be the name of an environment variable (letters, digits, _) (name the variable that holds the key, e.g. FLEET_API_KEY, never the key itself)",
        ]
    );
    assert!(!stdout.contains("sk-live-123"), "{stdout}");
}

#[test]
fn a_yaml_syntax_error_has_line_and_column() {
    check_fixture(
        "syntax-error",
        &[
            "tests/fixtures/config/syntax-error.yaml: 1 problem",
            "  tests/fixtures/config/syntax-error.yaml:3:7: YAML syntax error: illegal placement of ':' indicator",
        ],
    );
}

#[test]
fn show_fails_with_every_problem_on_stderr() {
    let out = fleet()
        .args([
            "--profiles-dir",
            FIXTURES,
            "profile",
            "show",
            "duplicate-key",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert_eq!(
        String::from_utf8(out.stderr).unwrap(),
        "error: tests/fixtures/config/duplicate-key.yaml:5:3: server.context_length: duplicate key (first set on line 4; keep one of them)\n"
    );
}

#[test]
fn an_unknown_profile_lists_the_available_ones() {
    let out = fleet()
        .args(["profile", "show", "blackwell-nobuffer"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.starts_with(
            "error: profile `blackwell-nobuffer` not found: no file at profiles/blackwell-nobuffer.yaml \
             (did you mean `blackwell-no-buffer`?); available: "
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("blackwell-extra-buffer, blackwell-no-buffer"),
        "{stderr}"
    );
}

#[test]
fn show_prints_the_resolved_profile_and_it_loads_again() {
    let out = fleet()
        .args(["profile", "show", "blackwell-extra-buffer"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let yaml = String::from_utf8(out.stdout).unwrap();
    for line in [
        "model: /models/Qwen3.6-27B",
        "port_base: 30000",
        "  mem_fraction_static: 0.85",
        "  context_length: 8192",
        "  attention_backend: flashinfer",
        "  mamba_strategy: extra_buffer",
        "  enable_metrics: true",
        "  startup_timeout: 20m",
        "  - --trust-remote-code",
    ] {
        assert!(
            yaml.lines().any(|l| l == line),
            "missing `{line}` in:\n{yaml}"
        );
    }
    assert!(!yaml.contains("extends"), "{yaml}");

    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("resolved.yaml"), &yaml).unwrap();
    let again = fleet()
        .args([
            "--profiles-dir",
            dir.path().to_str().unwrap(),
            "profile",
            "show",
            "resolved",
        ])
        .output()
        .unwrap();
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert_eq!(String::from_utf8(again.stdout).unwrap(), yaml);
}

#[test]
fn show_json_gives_the_typed_profile() {
    let out = fleet()
        .args([
            "--json",
            "profile",
            "show",
            "profiles/blackwell-no-buffer.yaml",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["name"], "blackwell-no-buffer");
    assert_eq!(v["server"]["mamba_strategy"], "no_buffer");
    assert_eq!(v["server"]["mem_fraction_static"], 0.85);
    assert_eq!(v["launcher"][2], "sglang.launch_server");
    assert_eq!(v["env"]["HF_HUB_OFFLINE"], "1");
    assert_eq!(v["health"]["startup_timeout"], "20m");
}

#[test]
fn check_without_names_validates_every_profile_of_the_directory() {
    let out = fleet().args(["profile", "check"]).output().unwrap();
    // Every shipped profile is valid, the two Blackwell ones among them.
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.lines().all(|l| l.ends_with(": ok")), "{stdout}");
    assert!(
        stdout.contains("profiles/blackwell-extra-buffer.yaml: ok\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("profiles/blackwell-no-buffer.yaml: ok\n"),
        "{stdout}"
    );
    assert_eq!(out.status.code(), Some(0));

    let out = fleet()
        .args(["--profiles-dir", FIXTURES, "profile", "check"])
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stdout.contains("tests/fixtures/config/good.yaml: ok\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("tests/fixtures/config/wrong-type.yaml: 5 problems\n"),
        "{stdout}"
    );
    assert!(
        String::from_utf8(out.stderr)
            .unwrap()
            .contains("13 of 14 checked files invalid")
    );
}

#[test]
fn check_json_reports_problems_as_data() {
    let out = fleet()
        .args([
            "--json",
            "--profiles-dir",
            FIXTURES,
            "profile",
            "check",
            "good",
            "bad-mamba",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["ok"], true);
    assert_eq!(v[1]["ok"], false);
    let p = &v[1]["problems"][0];
    assert_eq!(
        (p["line"].as_u64(), p["column"].as_u64()),
        (Some(4), Some(19))
    );
    assert_eq!(p["field"], "server.mamba_strategy");
    assert_eq!(p["file"], "tests/fixtures/config/bad-mamba.yaml");
}

/// Writes a profile directory with an inventory beside it.
fn with_inventory(inventory: &str, profile: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("fleet.yaml"), inventory).unwrap();
    fs::write(dir.path().join("p.yaml"), profile).unwrap();
    dir
}

fn check_in(dir: &Path) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_fleet"))
        .current_dir(dir)
        .env_remove("FLEET_CONFIG")
        .env_remove("FLEET_PROFILES_DIR")
        .args(["--profiles-dir", ".", "profile", "check"])
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8(out.stdout).unwrap())
}

#[test]
fn ports_past_65535_for_the_inventorys_gpus_are_refused() {
    let dir = with_inventory(
        "hosts:\n  - name: ct200\n    container: 200\n    gpus: [0, 1, 2, 3, 4, 5, 6, 7]\n",
        "model: m\nlauncher: [x]\nport_base: 65530\n",
    );
    let (code, stdout) = check_in(dir.path());
    assert_eq!(code, Some(2));
    assert_eq!(
        stdout,
        "./p.yaml: 1 problem\n  ./p.yaml: port_base: GPU 7 of host `ct200` would listen on port 65537 (65530 + 7), \
         above 65535 (use a port_base of at most 65528)\n"
    );
}

#[test]
fn an_inventory_with_a_port_collision_fails_the_check() {
    let dir = with_inventory(
        "hosts:\n  - {name: a, ssh: root@pve, container: 200, gpus: [0, 1]}\n  - {name: b, ssh: root@pve, container: 200, gpus: [1, 2]}\n",
        "model: m\nlauncher: [x]\n",
    );
    let (code, stdout) = check_in(dir.path());
    assert_eq!(code, Some(2));
    assert_eq!(
        stdout,
        "fleet.yaml: 1 problem\n  fleet.yaml:3:52: hosts[1].gpus: port collision: host `b` shares GPUs 1 with host `a` (line 2) \
         on the same machine and container (give each host distinct GPUs, or merge them into one host)\n./p.yaml: ok\n"
    );
}
