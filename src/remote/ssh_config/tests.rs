use super::*;

fn target(user: Option<&str>, host: &str, port: Option<u16>) -> SshTarget {
    SshTarget {
        user: user.map(String::from),
        host: host.into(),
        port,
    }
}

fn home_with_config(config: &str) -> tempfile::TempDir {
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join(".ssh")).unwrap();
    std::fs::write(home.path().join(".ssh/config"), config).unwrap();
    home
}

fn resolve_in(
    home: &tempfile::TempDir,
    t: SshTarget,
    opts: &[(&str, &str)],
) -> Result<Resolved, SshConfigError> {
    let opts: BTreeMap<String, String> = opts
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    resolve(&t, &opts, Some(home.path()))
}

#[test]
fn ssh_config_fills_in_what_the_inventory_leaves_out() {
    let home = home_with_config(
        "Host ct-host\n  HostName 10.1.2.6\n  Port 2222\n  User admin\n  IdentityFile ~/.ssh/fleet_key\n  UserKnownHostsFile ~/.ssh/kh\n  ForwardX11 no\n",
    );
    let r = resolve_in(&home, target(None, "ct-host", None), &[]).unwrap();
    assert_eq!(r.alias, "ct-host");
    assert_eq!(r.hostname, "10.1.2.6");
    assert_eq!(r.port, 2222);
    assert_eq!(r.user, "admin");
    assert_eq!(r.identity_files, vec![home.path().join(".ssh/fleet_key")]);
    assert_eq!(r.known_hosts, home.path().join(".ssh/kh"));
    assert_eq!(r.known_hosts_name(), "[10.1.2.6]:2222");
    assert_eq!(r.keepalive, DEFAULT_KEEPALIVE);
    assert!(!r.identities_only && r.jump.is_none());
}

#[test]
fn inventory_overrides_config_and_options_override_both() {
    let home = home_with_config("Host ct-host\n  Port 2222\n  User admin\n");
    let r = resolve_in(&home, target(Some("root"), "ct-host", Some(22)), &[]).unwrap();
    assert_eq!(
        (r.user.as_str(), r.port, r.known_hosts_name()),
        ("root", 22, "ct-host".to_string())
    );
    let r = resolve_in(
        &home,
        target(None, "ct-host", None),
        &[("port", "2200"), ("User", "ops")],
    )
    .unwrap();
    assert_eq!((r.user.as_str(), r.port), ("ops", 2200));
    assert_eq!(r.known_hosts, home.path().join(".ssh/known_hosts"));
}

#[test]
fn default_identities_are_the_existing_ones_in_openssh_order() {
    let home = home_with_config("");
    for f in ["id_rsa", "id_ed25519"] {
        std::fs::write(home.path().join(".ssh").join(f), "").unwrap();
    }
    let r = resolve_in(&home, target(Some("u"), "h", None), &[]).unwrap();
    assert_eq!(
        r.identity_files,
        vec![
            home.path().join(".ssh/id_ed25519"),
            home.path().join(".ssh/id_rsa")
        ]
    );
}

#[test]
fn tokens_in_paths_are_expanded_and_unknown_ones_refused() {
    let home = home_with_config(
        "Host pve\n  HostName 10.1.2.6\n  User root\n  IdentityFile ~/.ssh/%n-%r@%h:%p\n  UserKnownHostsFile %d/kh-100%%\nHost bad\n  IdentityFile ~/.ssh/%C\n",
    );
    let r = resolve_in(&home, target(None, "pve", None), &[]).unwrap();
    assert_eq!(
        r.identity_files,
        vec![home.path().join(".ssh/pve-root@10.1.2.6:22")]
    );
    assert_eq!(r.known_hosts, home.path().join("kh-100%"));
    let err = resolve_in(&home, target(Some("u"), "bad", None), &[])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(".ssh/config:7") && err.contains("`%C`"),
        "{err}"
    );
}

#[test]
fn connect_timeout_comes_from_options_then_config() {
    let home = home_with_config("Host ct-host\n  ConnectTimeout 7\n");
    let t = target(Some("u"), "ct-host", None);
    let r = resolve_in(&home, t.clone(), &[]).unwrap();
    assert_eq!(r.connect_timeout, Some(Duration::from_secs(7)));
    let r = resolve_in(&home, t, &[("ConnectTimeout", "3")]).unwrap();
    assert_eq!(r.connect_timeout, Some(Duration::from_secs(3)));
    let r = resolve_in(&home, target(Some("u"), "other", None), &[]).unwrap();
    assert_eq!(r.connect_timeout, None);
}

#[test]
fn keepalives_are_honoured_from_options_then_config() {
    let home = home_with_config(
        "Host pve\n  ServerAliveInterval 1m30s\n  ServerAliveCountMax 5\nHost quiet\n  ServerAliveInterval 0\n",
    );
    let r = resolve_in(&home, target(Some("u"), "pve", None), &[]).unwrap();
    assert_eq!(
        r.keepalive,
        Keepalive {
            interval: Some(Duration::from_secs(90)),
            max: 5
        }
    );
    let r = resolve_in(
        &home,
        target(Some("u"), "pve", None),
        &[("ServerAliveInterval", "2"), ("ServerAliveCountMax", "1")],
    )
    .unwrap();
    assert_eq!(
        r.keepalive,
        Keepalive {
            interval: Some(Duration::from_secs(2)),
            max: 1
        }
    );
    let r = resolve_in(&home, target(Some("u"), "quiet", None), &[]).unwrap();
    assert_eq!(r.keepalive.interval, None);
    let home = home_with_config("Host pve\n  ServerAliveInterval soon\n");
    let err = resolve_in(&home, target(Some("u"), "pve", None), &[])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(".ssh/config:2: ServerAliveInterval \"soon\": not a time"),
        "{err}"
    );
}

#[test]
fn identities_only_is_read() {
    let home = home_with_config("Host pve\n  IdentitiesOnly yes\n  IdentityFile ~/.ssh/k\n");
    let r = resolve_in(&home, target(Some("u"), "pve", None), &[]).unwrap();
    assert!(r.identities_only);
    let r = resolve_in(
        &home,
        target(Some("u"), "pve", None),
        &[("IdentitiesOnly", "no")],
    )
    .unwrap();
    assert!(!r.identities_only);
}

#[test]
fn proxy_jump_becomes_a_chain_of_hops_each_resolved_through_the_config() {
    let home = home_with_config(
        "Host pve\n  HostName 10.1.2.6\n  User root\n  ProxyJump bastion\n\
         Host bastion\n  HostName bastion.example.org\n  Port 2201\n  User jump\n  IdentityFile ~/.ssh/bastion_key\n",
    );
    let r = resolve_in(&home, target(None, "pve", None), &[]).unwrap();
    let j = r.jump.as_deref().expect("a jump host");
    assert_eq!(
        (
            j.alias.as_str(),
            j.hostname.as_str(),
            j.port,
            j.user.as_str()
        ),
        ("bastion", "bastion.example.org", 2201, "jump")
    );
    assert_eq!(j.identity_files, vec![home.path().join(".ssh/bastion_key")]);
    assert!(j.jump.is_none());
    assert_eq!(r.hops(), ["bastion"]);
    assert_eq!(
        r.identity(),
        "root@10.1.2.6 via jump@[bastion.example.org]:2201"
    );
    // ssh_options win, and `none` turns the jump off.
    let r = resolve_in(&home, target(None, "pve", None), &[("ProxyJump", "none")]).unwrap();
    assert!(r.jump.is_none());
}

#[test]
fn a_jump_list_is_hopped_in_order_with_user_and_port_from_the_entry() {
    let home = home_with_config(
        "Host pve\n  ProxyJump ops@outer:2022,ssh://inner\nHost inner\n  ProxyJump elsewhere\n  User in\nHost outer\n  HostName 192.0.2.1\n",
    );
    let r = resolve_in(&home, target(Some("root"), "pve", None), &[]).unwrap();
    assert_eq!(r.hops(), ["outer", "inner"]);
    let inner = r.jump.as_deref().unwrap();
    assert_eq!((inner.alias.as_str(), inner.user.as_str()), ("inner", "in"));
    // The list, not inner's own ProxyJump, says how inner is reached.
    let outer = inner.jump.as_deref().unwrap();
    assert_eq!(
        (outer.hostname.as_str(), outer.port, outer.user.as_str()),
        ("192.0.2.1", 2022, "ops")
    );
    assert!(outer.jump.is_none());
}

#[test]
fn a_jump_loop_is_an_error_naming_the_chain() {
    let home = home_with_config("Host a\n  ProxyJump b\nHost b\n  ProxyJump a\n");
    let err = resolve_in(&home, target(Some("u"), "a", None), &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("ProxyJump loop: a -> b -> a"), "{err}");
}

#[test]
fn proxy_command_is_refused_with_file_line_and_what_to_do() {
    let home = home_with_config(
        "# lab\nHost pve\n  HostName 10.1.2.6\n  ProxyCommand ssh -W %h:%p bastion\n",
    );
    let err = resolve_in(&home, target(Some("u"), "pve", None), &[]).unwrap_err();
    assert!(matches!(err, SshConfigError::Refused { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.starts_with(&format!(
            "{}:4: `ProxyCommand ssh -W %h:%p bastion` is not supported by fleet",
            home.path().join(".ssh/config").display()
        )),
        "{msg}"
    );
    assert!(msg.contains("use `ProxyJump host`"), "{msg}");
    // A ProxyJump obtained first wins over it, as in OpenSSH; `none` is no proxy.
    let home = home_with_config(
        "Host pve\n  ProxyJump bastion\nHost bastion\n  ProxyCommand none\nHost *\n  ProxyCommand nc %h %p\n",
    );
    let r = resolve_in(&home, target(Some("u"), "pve", None), &[]).unwrap();
    assert_eq!(r.hops(), ["bastion"]);
    // ...and a ProxyCommand obtained first wins over a later ProxyJump.
    let home = home_with_config("Host pve\n  ProxyCommand none\n  ProxyJump bastion\n");
    let r = resolve_in(&home, target(Some("u"), "pve", None), &[]).unwrap();
    assert!(r.jump.is_none());
}

#[test]
fn directives_that_change_the_connection_are_refused_and_harmless_ones_ignored() {
    for (line, directive) in [
        ("HostKeyAlias pve-key", "HostKeyAlias pve-key"),
        (
            "CertificateFile ~/.ssh/id-cert.pub",
            "CertificateFile ~/.ssh/id-cert.pub",
        ),
        ("IdentityAgent ~/.1password/agent.sock", "IdentityAgent"),
        ("CanonicalizeHostname yes", "CanonicalizeHostname yes"),
        ("BindAddress 10.0.0.5", "BindAddress"),
        ("RemoteCommand tmux attach", "RemoteCommand"),
    ] {
        let home = home_with_config(&format!("Host pve\n  User u\n  {line}\n"));
        let err = resolve_in(&home, target(None, "pve", None), &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(".ssh/config:3: `") && err.contains(directive) && err.contains("hint:"),
            "{line}: {err}"
        );
    }
    let home = home_with_config(
        "Host pve\n  User u\n  ControlMaster auto\n  ControlPath ~/.ssh/cm-%r@%h:%p\n  Compression yes\n  ForwardAgent yes\n  CanonicalizeHostname no\n  IdentityAgent SSH_AUTH_SOCK\n  StrictHostKeyChecking accept-new\n",
    );
    resolve_in(&home, target(None, "pve", None), &[]).unwrap();
    // A refused directive in a block for other hosts is no concern of this one.
    let home = home_with_config("Host other\n  ProxyCommand nc %h %p\n");
    resolve_in(&home, target(Some("u"), "pve", None), &[]).unwrap();
}

#[test]
fn unknown_keywords_are_refused_unless_ignore_unknown_names_them() {
    let home = home_with_config("Host pve\n  FrobnicateHost yes\n");
    let err = resolve_in(&home, target(Some("u"), "pve", None), &[])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(".ssh/config:2: `FrobnicateHost`") && err.contains("IgnoreUnknown"),
        "{err}"
    );
    let home =
        home_with_config("IgnoreUnknown Frob*,UseKeychain\nHost pve\n  FrobnicateHost yes\n");
    resolve_in(&home, target(Some("u"), "pve", None), &[]).unwrap();
}

#[test]
fn refusals_in_a_jump_hosts_config_name_their_line() {
    let home = home_with_config(
        "Host pve\n  ProxyJump bastion\nHost bastion\n  HostName 192.0.2.9\n  HostKeyAlias x\n",
    );
    let err = resolve_in(&home, target(Some("u"), "pve", None), &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains(".ssh/config:5: `HostKeyAlias x`"), "{err}");
}

#[test]
fn unknown_options_and_bad_values_are_named() {
    let home = home_with_config("");
    let err = resolve_in(
        &home,
        target(Some("u"), "h", None),
        &[("ProxyCommand", "x")],
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("`ProxyCommand`"), "{err}");
    let err = resolve_in(&home, target(Some("u"), "h", None), &[("Port", "http")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("\"http\""), "{err}");
    let err = resolve_in(
        &home,
        target(Some("u"), "h", None),
        &[("ProxyJump", "a,@b")],
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("ProxyJump \"a,@b\"") && err.contains("empty user"),
        "{err}"
    );
}

#[test]
fn parse_time_follows_openssh() {
    let t = |v: &str| {
        let s = Setting {
            keyword: "ConnectTimeout".into(),
            args: vec![v.into()],
            origin: Origin::Inventory,
            order: 0,
        };
        parse_time(&s).ok()
    };
    assert_eq!(t("10"), Some(Duration::from_secs(10)));
    assert_eq!(t("1m30s"), Some(Duration::from_secs(90)));
    assert_eq!(t("2H"), Some(Duration::from_secs(7200)));
    assert_eq!(t("0"), Some(Duration::ZERO));
    for bad in ["", "s", "1x", "-1", "1.5"] {
        assert_eq!(t(bad), None, "{bad}");
    }
}
