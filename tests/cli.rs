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

/// An error names its cause once, even where the message already quotes it.
#[test]
fn an_error_says_its_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().to_str().unwrap();
    let out = fleet(&["--config", config, "status"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.trim(),
        format!("error: cannot read {config}: Is a directory (os error 21)")
    );
}

/// Every argument of every subcommand, at every depth, says what it is for in `--help`.
#[test]
fn every_flag_and_argument_of_every_subcommand_has_a_help_line() {
    use clap::CommandFactory;
    fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
        for arg in cmd.get_arguments() {
            if arg.get_help().is_none() && arg.get_long_help().is_none() {
                missing.push(format!("{path} {}", arg.get_id()));
            }
        }
        for sub in cmd.get_subcommands() {
            walk(sub, &format!("{path} {}", sub.get_name()), missing);
        }
    }
    let mut cmd = fleet::cli::Cli::command();
    cmd.build();
    let mut missing = Vec::new();
    walk(&cmd, "fleet", &mut missing);
    assert!(missing.is_empty(), "arguments without help: {missing:?}");
    // What the walk checks is what a user reads: each flag's line is followed by its help.
    let out = fleet(&["generate", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = help.lines().collect();
    for flag in [
        "--max-tokens",
        "--temperature",
        "--top-p",
        "--limit",
        "--max-retries",
    ] {
        let at = lines
            .iter()
            .position(|l| l.trim_start().starts_with(flag))
            .unwrap_or_else(|| panic!("{flag} missing:\n{help}"));
        let next = lines.get(at + 1).map_or("", |l| l.trim());
        assert!(
            !next.is_empty() && !next.starts_with('-'),
            "{flag} has no help text:\n{help}"
        );
    }
}
