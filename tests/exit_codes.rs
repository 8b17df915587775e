//! Exit codes through the real binary: 3 when an error stopped the command, 70 for a bug.

fn fleet(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let home = tempfile::tempdir().unwrap();
    let mut c = assert_cmd::Command::cargo_bin("fleet").unwrap();
    c.args(args)
        .env_remove("FLEET_CONFIG")
        .env("HOME", home.path())
        .env_remove("SSH_AUTH_SOCK");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

#[test]
fn the_only_host_unreachable_fails_the_command_with_exit_3() {
    let dir = tempfile::tempdir().unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let inventory = dir.path().join("fleet.yaml");
    std::fs::write(
        &inventory,
        format!("hosts:\n  - name: gone\n    ssh: root@127.0.0.1:{closed}\n"),
    )
    .unwrap();
    let out = fleet(&["--config", inventory.to_str().unwrap(), "jobs"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("error: gone: ") && stderr.contains(&format!("127.0.0.1]:{closed}")),
        "names the host: {stderr}"
    );
}

#[test]
fn a_panic_is_an_internal_error_with_exit_70_and_where_it_happened() {
    let out = fleet(&["jobs"], &[("FLEET_TEST_HOOK_PANIC", "1")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(70), "{stderr}");
    assert!(
        stderr.contains("internal error: FLEET_TEST_HOOK_PANIC is set at src/commands/entry.rs:")
            && stderr.trim_end().ends_with("; please report it"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("panicked at"),
        "no raw panic text: {stderr}"
    );
}
