//! The inventory as users write it: every problem at its place, SSH targets, collisions.

use super::*;

fn load(text: &str) -> Result<Inventory, ConfigError> {
    inventory_from_str(text, Path::new("fleet.yaml"))
}

fn machine(inv: &Inventory, i: usize) -> &MachineSpec {
    inv.hosts[i].machine().expect("a machine")
}

fn shown(text: &str) -> Vec<String> {
    match load(text) {
        Err(ConfigError::Invalid(p)) => p.iter().map(|p| p.to_string()).collect(),
        other => panic!("expected problems, got {other:?}"),
    }
}

#[test]
fn a_slurm_host_reads_with_its_login_and_machine_keys_are_refused() {
    let inv = load(
            "hosts:\n  - name: hpc\n    ssh: me@login\n    slurm:\n      partition: gpu\n      gpus: 16\n      time: 60\n",
        )
        .unwrap();
    let HostSpec::Slurm(s) = &inv.hosts[0] else {
        panic!("a Slurm host: {inv:?}")
    };
    assert_eq!((inv.hosts[0].name(), s.slurm.servers()), ("hpc", Some(16)));
    assert_eq!(s.login.ssh.as_ref().map(|t| t.host.as_str()), Some("login"));
    let problems = shown(
        "hosts:\n  - name: hpc\n    container: 200\n    slurm:\n      job: 7\n      time: 60\n",
    );
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems[0]
            .starts_with("fleet.yaml:3:16: hosts[0].container: does not apply to a Slurm host"),
        "{problems:?}"
    );
    assert!(
        problems[1].contains("hosts[0].slurm.time: applies only"),
        "{problems:?}"
    );
}

#[test]
fn the_design_example_loads() {
    let inv = load(
            "hosts:\n  - name: ct200\n    ssh: root@10.1.2.6\n    container: 200\n    gpus: [0,1,2,3,4,5,6,7]\n    address: 10.1.2.50\n    ssh_options: {identityfile: ~/.ssh/id_ed25519, Port: 2222}\n  - name: local\n",
        )
        .unwrap();
    let h = machine(&inv, 0);
    assert_eq!(
        h.ssh,
        Some(SshTarget {
            user: Some("root".into()),
            host: "10.1.2.6".into(),
            port: None
        })
    );
    assert_eq!(h.container, Some(200));
    assert_eq!(h.gpus, GpuSelection::List((0..8).collect()));
    assert_eq!(h.address.as_deref(), Some("10.1.2.50"));
    assert_eq!(h.ssh_options["IdentityFile"], "~/.ssh/id_ed25519");
    assert_eq!(h.ssh_options["Port"], "2222");
    let local = machine(&inv, 1);
    assert_eq!(
        (local.ssh.as_ref(), local.container, &local.gpus),
        (None, None, &GpuSelection::All)
    );
}

#[test]
fn ssh_targets() {
    let t = |s: &str| {
        parse_ssh_target(s)
            .map(|t| t.to_string())
            .map_err(|e| e.to_string())
    };
    assert_eq!(t("root@host:2222"), Ok("root@host:2222".into()));
    assert_eq!(t("host"), Ok("host".into()));
    assert_eq!(t("admin@[::1]:22"), Ok("admin@[::1]:22".into()));
    assert_eq!(parse_ssh_target("[fe80::1]").unwrap().host, "fe80::1");
    for bad in [
        "@host",
        "root@",
        "root@host:0",
        "root@host:x",
        "root@::1",
        "root@-oProxyCommand=x",
        "a b",
    ] {
        assert!(parse_ssh_target(bad).is_err(), "{bad}");
    }
}

#[test]
fn every_problem_is_reported_with_its_place() {
    let text = "hosts:
  - name: a
    ssh: root@host:99999
    container: 5
    gpus: [0, 1, 1]
    ssh_options: {Prot: 22}
  - name: a
    gpus: none
  - nme: c
";
    assert_eq!(
        shown(text),
        [
            "fleet.yaml:3:10: hosts[0].ssh: `root@host:99999`: port `99999` is not 1..=65535 (write user@host or user@host:port; omit ssh for this machine)",
            "fleet.yaml:4:16: hosts[0].container: 5 is out of range (must be 100..=999999999)",
            "fleet.yaml:5:18: hosts[0].gpus[2]: GPU 1 is listed twice (already at hosts[0].gpus[1])",
            "fleet.yaml:6:19: hosts[0].ssh_options.Prot: unknown or unsupported ssh option (did you mean `Port`?)",
            "fleet.yaml:8:11: hosts[1].gpus: expected `all` or a list of GPU indices, found the string `none`",
            "fleet.yaml:9:5: hosts[2].nme: unknown key (did you mean `name`?)",
            "fleet.yaml:9:5: hosts[2].name: missing required key",
        ]
    );
}

#[test]
fn same_machine_and_container_with_shared_gpus_collide() {
    let text = "hosts:
  - {name: a, ssh: root@pve, container: 200, gpus: [0, 1, 2, 3]}
  - {name: b, ssh: admin@pve:22, container: 200, gpus: [3, 4]}
  - {name: c, ssh: root@pve, container: 201, gpus: [0]}
  - {name: d, ssh: root@pve, container: 200, gpus: [4, 5]}
";
    let p = shown(text);
    assert_eq!(p.len(), 2, "{p:?}");
    assert!(
        p[0].starts_with("fleet.yaml:3:")
            && p[0].contains("host `b` shares GPUs 3 with host `a` (line 2)"),
        "{p:?}"
    );
    assert!(
        p[1].starts_with("fleet.yaml:5:")
            && p[1].contains("host `d` shares GPUs 4 with host `b` (line 3)"),
        "{p:?}"
    );
}

#[test]
fn duplicate_names_keys_and_empty_hosts() {
    let p = shown("hosts:\n  - name: a\n  - name: a\n    name: b\n");
    assert_eq!(p.len(), 3, "{p:?}");
    assert!(
        p.iter()
            .any(|l| l.starts_with("fleet.yaml:4:5: hosts[1].name: duplicate key")),
        "{p:?}"
    );
    assert!(
        p.iter().any(|l| l.contains("host name `a` is used twice")),
        "{p:?}"
    );
    assert!(p.iter().any(|l| l.contains("port collision")), "{p:?}");
    assert_eq!(
        shown("hosts: []\n"),
        ["fleet.yaml:1:8: hosts: no hosts (list at least one, e.g. `- name: local`)"]
    );
}

#[test]
fn ssh_options_need_an_ssh_host() {
    let p = shown("hosts:\n  - name: a\n    ssh_options: {Port: 22}\n");
    assert_eq!(p.len(), 1);
    assert!(p[0].contains("set on a host without `ssh`"), "{p:?}");
    let p =
        shown("hosts:\n  - name: a\n    ssh: me@h:2222\n    ssh_options: {Port: 22, user: me}\n");
    assert_eq!(
        p,
        [
            "fleet.yaml:4:19: hosts[0].ssh_options.Port: `22` contradicts `2222` in `ssh:` (set it in one place)"
        ]
    );
}

#[test]
fn jump_and_keepalive_options_are_checked() {
    let inv = load(
            "hosts:\n  - name: a\n    ssh: root@pve\n    ssh_options:\n      ProxyJump: ops@bastion:2222,inner\n      ServerAliveInterval: 0\n      serveralivecountmax: 5\n      IdentitiesOnly: yes\n",
        )
        .unwrap();
    let o = &machine(&inv, 0).ssh_options;
    assert_eq!(o["ProxyJump"], "ops@bastion:2222,inner");
    assert_eq!(o["ServerAliveInterval"], "0");
    assert_eq!(o["ServerAliveCountMax"], "5");
    assert_eq!(o["IdentitiesOnly"], "yes");
    let inv = load("hosts:\n  - name: a\n    ssh: pve\n    ssh_options: {ProxyJump: none, IdentitiesOnly: false}\n").unwrap();
    assert_eq!(machine(&inv, 0).ssh_options["IdentitiesOnly"], "no");
    let p = shown(
        "hosts:\n  - name: a\n    ssh: pve\n    ssh_options:\n      ProxyJump: bastion,@x\n      IdentitiesOnly: maybe\n      ServerAliveInterval: -1\n      ProxyCommand: nc\n",
    );
    assert_eq!(p.len(), 4, "{p:?}");
    assert!(
        p[0].starts_with("fleet.yaml:5:18: hosts[0].ssh_options.ProxyJump: `@x` has an empty user"),
        "{p:?}"
    );
    assert!(
        p[1].starts_with(
            "fleet.yaml:6:23: hosts[0].ssh_options.IdentitiesOnly: `maybe` is not yes or no"
        ),
        "{p:?}"
    );
    assert!(
        p[2].starts_with("fleet.yaml:7:28: hosts[0].ssh_options.ServerAliveInterval"),
        "{p:?}"
    );
    assert!(
        p[3].contains("ProxyCommand: unknown or unsupported ssh option"),
        "{p:?}"
    );
}

#[test]
fn a_missing_file_says_where_it_looked_and_shows_an_example() {
    let dir = tempfile::tempdir().unwrap();
    let e = load_inventory(&dir.path().join("fleet.yaml"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&dir.path().join("fleet.yaml").display().to_string()),
        "{e}"
    );
    assert!(
        e.contains("--config") && e.contains("hosts:\n  - name: local"),
        "{e}"
    );
}

#[test]
fn the_shipped_example_is_valid() {
    let inv =
        load_inventory(&Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/fleet.yaml")).unwrap();
    assert_eq!(inv.hosts.len(), 1);
    assert_eq!(machine(&inv, 0).container, Some(200));
    assert_eq!(machine(&inv, 0).gpus, GpuSelection::List((0..8).collect()));
}
