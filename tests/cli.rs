//! The command line itself through the real binary: shell completions and usage errors.

fn fleet(args: &[&str]) -> std::process::Output {
    assert_cmd::Command::cargo_bin("fleet")
        .unwrap()
        .args(args)
        .env_remove("FLEET_CONFIG")
        .output()
        .unwrap()
}

#[test]
fn completions_cover_every_subcommand_for_each_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let out = fleet(&["completions", shell]);
        assert_eq!(out.status.code(), Some(0), "{shell}");
        let script = String::from_utf8_lossy(&out.stdout);
        for sub in [
            "up", "status", "down", "logs", "gpus", "sweep", "generate", "demo",
        ] {
            assert!(script.contains(sub), "{shell} completions lack `{sub}`");
        }
    }
}

#[test]
fn a_bad_flag_or_shell_is_a_usage_error_with_exit_2() {
    let out = fleet(&["completions", "powerpoint"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid value 'powerpoint'"));
    let out = fleet(&["up", "--profiel", "x"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--profile"),
        "suggests the flag"
    );
}
