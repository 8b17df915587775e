//! `fleet exec` through the real binary, against a real sshd reached the OpenSSH way: an alias in
//! `~/.ssh/config` of a temporary HOME, its known_hosts and key, and the fake `pct`.

mod common;

use std::path::Path;

use common::{Agent, Sshd, TestHome, unique};

const ALIAS: &str = "fleet-test-host";

/// gpu1 (bare SSH host), ct200 (a container on it) and, optionally, a host nobody listens for.
fn inventory(home: &TestHome, with_down_host: bool) -> String {
    let mut yaml = format!(
        "hosts:\n\
         \x20 - name: gpu1\n    ssh: {ALIAS}\n    gpus: all\n\
         \x20 - name: ct200\n    ssh: {ALIAS}\n    container: 200\n    address: 127.0.0.1\n    gpus: all\n"
    );
    if with_down_host {
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        yaml.push_str(&format!(
            "  - name: down\n    ssh: root@127.0.0.1:{closed}\n    gpus: all\n"
        ));
    }
    home.write_inventory(&yaml).display().to_string()
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn exec_runs_on_every_host_with_values_as_literal_data_and_reports_the_unreachable_one() {
    let sshd = Sshd::start();
    let home = sshd.home(ALIAS);
    let config = inventory(&home, true);
    let marker = format!("/tmp/{}", unique("pwned"));
    let out = home
        .fleet()
        .args(["--config", &config, "exec", "--", "printf", "<%s>\\n"])
        .args([
            format!("x; touch {marker}"),
            "$(id)".into(),
            "it's \"q\"".into(),
            "*".into(),
        ])
        .output()
        .unwrap();
    let text = stdout(&out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "one host is down: exit 1\n{text}{}",
        stderr(&out)
    );
    let expected = format!("<x; touch {marker}>\n<$(id)>\n<it's \"q\">\n<*>\n");
    for host in ["gpu1", "ct200"] {
        let section = format!("== {host} ==\n{expected}");
        assert!(text.contains(&section), "missing\n{section}\nin\n{text}");
    }
    assert!(
        text.contains("== down (unreachable) ==\ndown: cannot connect to [127.0.0.1]:"),
        "{text}"
    );
    // gpu1 runs on the host, ct200 in its container with a /tmp of its own.
    for seen_at in [
        Path::new(&marker).to_path_buf(),
        sshd.container_path(200, &marker),
    ] {
        assert!(
            !seen_at.exists(),
            "{} was created: a value ran as shell code",
            seen_at.display()
        );
    }
}

#[test]
fn exec_exit_code_and_json_follow_the_commands() {
    let sshd = Sshd::start();
    let home = sshd.home(ALIAS);
    let config = inventory(&home, false);
    home.fleet()
        .args(["--config", &config, "exec", "--host", "ct200", "--", "true"])
        .assert()
        .code(0);

    let out = home
        .fleet()
        .args([
            "--config",
            &config,
            "--json",
            "exec",
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; exit 3",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    let rows = json.as_array().expect("an array");
    assert_eq!(rows.len(), 2);
    for (row, host) in rows.iter().zip(["gpu1", "ct200"]) {
        assert_eq!(row["host"], host);
        assert_eq!(row["status"], 3);
        assert_eq!(row["stdout"], "out\n");
        assert_eq!(row["stderr"], "err\n");
        assert!(row["error"].is_null());
    }

    let out = home
        .fleet()
        .args(["--config", &config, "exec", "--host", "nope", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("--host nope: no such host") && stderr(&out).contains("gpu1, ct200"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_stopped_container_is_reported_by_name() {
    let sshd = Sshd::start_with_env(&[("FAKE_PCT_RUNNING", "100")]);
    let home = sshd.home(ALIAS);
    let config = inventory(&home, false);
    let out = home
        .fleet()
        .args(["--config", &config, "exec", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    assert!(text.contains("== gpu1 ==\n"), "{text}");
    assert!(
        text.contains("== ct200 (unreachable) ==\nct200: container 200 is not running")
            && text.contains("pct status 200"),
        "{text}"
    );
}

#[test]
fn a_new_host_key_needs_accept_new_host_key_and_is_then_recorded() {
    let sshd = Sshd::start();
    let home = sshd.home(ALIAS);
    std::fs::write(home.known_hosts(), "").unwrap();
    let config = inventory(&home, false);
    let out = home
        .fleet()
        .args(["--config", &config, "exec", "--host", "gpu1", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    assert!(
        text.contains(&sshd.host_fingerprint()) && text.contains("--accept-new-host-key"),
        "{text}"
    );

    // Both hosts sit behind the same sshd and connect at once: the key is recorded once.
    home.fleet()
        .args([
            "--config",
            &config,
            "--accept-new-host-key",
            "exec",
            "--",
            "true",
        ])
        .assert()
        .code(0);
    assert_eq!(
        std::fs::read_to_string(home.known_hosts()).unwrap().trim(),
        sshd.known_hosts_line()
    );
    home.fleet()
        .args(["--config", &config, "exec", "--host", "gpu1", "--", "true"])
        .assert()
        .code(0);
}

#[test]
fn verbose_logs_each_remote_command_exactly_as_sent() {
    let sshd = Sshd::start();
    let home = sshd.home(ALIAS);
    let config = inventory(&home, false);
    let out = home
        .fleet()
        .args([
            "--config", &config, "-v", "exec", "--host", "ct200", "--", "echo", "a b",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let log = stderr(&out);
    let sent = fleet::remote::quote_argv(
        "x",
        &["pct", "exec", "200", "--", "bash", "-c", "echo 'a b'"].map(String::from),
    )
    .unwrap();
    assert!(log.contains(&sent), "stderr lacks `{sent}`:\n{log}");
    assert_eq!(stdout(&out), "== ct200 ==\na b\n");
}

#[test]
fn ssh_agent_keys_are_tried_first_and_refusals_list_what_was_tried() {
    let sshd = Sshd::start();
    let home = sshd.home(ALIAS);
    // No IdentityFile and no ~/.ssh/id_*: only the agent can log in.
    std::fs::write(
        home.path().join(".ssh/config"),
        format!(
            "Host {ALIAS}\n  HostName 127.0.0.1\n  Port {}\n  User {}\n",
            sshd.port, sshd.user
        ),
    )
    .unwrap();
    std::fs::remove_file(home.path().join(".ssh/fleet_test_key")).unwrap();
    let config = inventory(&home, false);

    let out = home
        .fleet()
        .args(["--config", &config, "exec", "--host", "gpu1", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains("refused authentication; tried: no keys"),
        "{}",
        stdout(&out)
    );

    let agent = Agent::start(&[&sshd.client_key]);
    home.fleet()
        .env("SSH_AUTH_SOCK", &agent.sock)
        .args(["--config", &config, "exec", "--host", "gpu1", "--", "true"])
        .assert()
        .code(0);

    let other = common::keygen(sshd.dir.path(), "agent_only_unauthorized");
    let wrong_agent = Agent::start(&[&other]);
    let out = home
        .fleet()
        .env("SSH_AUTH_SOCK", &wrong_agent.sock)
        .args(["--config", &config, "exec", "--host", "gpu1", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains("tried: agent key agent_only_unauthorized (SHA256:"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn a_container_on_this_machine_runs_through_the_local_pct() {
    let home = TestHome::empty();
    let containers = tempfile::tempdir().unwrap();
    let config = home
        .write_inventory("hosts:\n  - name: here\n  - name: ct-local\n    container: 200\n    address: 127.0.0.1\n")
        .display()
        .to_string();
    let path = format!(
        "{}:{}",
        common::fixtures_bin().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = home
        .fleet()
        .env("PATH", path)
        .env("FAKE_PCT_ROOT", containers.path())
        .args([
            "--config", &config, "exec", "--", "printf", "%s|", "a b", "$(id)",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "== here ==\na b|$(id)|\n== ct-local ==\na b|$(id)|\n"
    );
}

#[test]
fn a_world_of_two_hosts_each_with_its_own_key_container_and_tmp() {
    let world = common::world::World::new(2);
    let config = world.inventory("[0, 1]");
    let mark = format!("/tmp/{}", unique("left-by-fleet"));
    let out = world
        .home
        .fleet()
        .args(["--config"])
        .arg(&config)
        .args(["exec", "--", "sh", "-c", "echo \"$0\" > \"$1\" && ls /tmp"])
        .args(["hello", &mark])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let name = mark.trim_start_matches("/tmp/");
    // Each container's /tmp held nothing before: only what fleet just left there (beside the
    // host paths bound into every container, when the checkout lies under /tmp).
    let shared: Vec<String> = common::shared_into_containers()
        .split(':')
        .filter_map(|p| p.strip_prefix("/tmp/"))
        .filter_map(|rest| rest.split('/').next().map(String::from))
        .collect();
    let listed: String = stdout(&out)
        .lines()
        .filter(|l| !shared.iter().any(|s| s == l))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(
        listed,
        format!("== ct200 ==\n{name}\n== ct201 ==\n{name}\n")
    );
    for (i, h) in world.hosts.iter().enumerate() {
        assert_eq!(
            std::fs::read_to_string(world.container_path(i, &mark)).unwrap(),
            "hello\n"
        );
        assert_eq!(h.sshd.log().matches("Accepted publickey").count(), 1);
        assert_eq!(h.address, format!("127.0.0.{}", 2 + i));
    }
    assert!(!Path::new(&mark).exists(), "the client sees {mark}");
    assert_ne!(
        world.hosts[0].sshd.host_fingerprint(),
        world.hosts[1].sshd.host_fingerprint()
    );
}

#[test]
fn identities_only_offers_only_the_configured_keys_even_with_an_agent() {
    let sshd = Sshd::start();
    let home = sshd.home(ALIAS);
    let config = inventory(&home, false);
    // The agent holds the authorized key; the config names another one.
    let agent = Agent::start(&[&sshd.client_key]);
    let other = common::keygen(sshd.dir.path(), "configured_unauthorized");
    home.add_key(&other, "configured_key");
    let block = |extra: &str| {
        format!(
            "Host {ALIAS}\n  HostName 127.0.0.1\n  Port {}\n  User {}\n  IdentityFile ~/.ssh/configured_key\n{extra}",
            sshd.port, sshd.user
        )
    };
    let run = || {
        home.fleet()
            .env("SSH_AUTH_SOCK", &agent.sock)
            .args(["--config", &config, "exec", "--host", "gpu1", "--", "true"])
            .output()
            .unwrap()
    };
    // Without IdentitiesOnly the agent's key logs in, as with OpenSSH.
    std::fs::write(home.path().join(".ssh/config"), block("")).unwrap();
    assert_eq!(run().status.code(), Some(0));
    // With it, only the configured key is offered: refused, and the agent key never tried.
    std::fs::write(
        home.path().join(".ssh/config"),
        block("  IdentitiesOnly yes\n"),
    )
    .unwrap();
    let out = run();
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    assert!(
        text.contains("refused authentication; tried: ")
            && text.contains("configured_key")
            && !text.contains("agent key"),
        "{text}"
    );
    // An agent key that is one of the configured identities is still used (its public half
    // next to the configured path is enough, as in OpenSSH).
    std::fs::copy(
        format!("{}.pub", sshd.client_key.display()),
        home.path().join(".ssh/agent_only.pub"),
    )
    .unwrap();
    std::fs::write(
        home.path().join(".ssh/config"),
        block("  IdentitiesOnly yes\n  IdentityFile ~/.ssh/agent_only\n"),
    )
    .unwrap();
    assert_eq!(run().status.code(), Some(0), "{}", stdout(&run()));
}
