//! Where and as whom to connect, resolved the OpenSSH way: the inventory's `ssh_options`
//! override `user@host:port` from fleet.yaml, which overrides `~/.ssh/config` (`~` is `$HOME`),
//! which overrides the defaults (port 22, the local user, `~/.ssh/id_{ed25519,ecdsa,rsa}`,
//! `~/.ssh/known_hosts`).

use std::collections::BTreeMap;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ssh2_config::{ParseRule, SshConfig};

use crate::config::{SSH_OPTIONS, SshTarget};

const DEFAULT_IDENTITIES: [&str; 3] = ["id_ed25519", "id_ecdsa", "id_rsa"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Resolved {
    /// The address to connect to (HostName), also the name looked up in known_hosts.
    pub hostname: String,
    pub port: u16,
    pub user: String,
    /// Keys to offer, in order. Explicit `IdentityFile`s replace the defaults, as in OpenSSH.
    pub identity_files: Vec<PathBuf>,
    pub known_hosts: PathBuf,
    /// `ConnectTimeout` (seconds) from ssh_options or `~/.ssh/config`; else `--connect-timeout`.
    pub connect_timeout: Option<Duration>,
}

impl Resolved {
    /// How OpenSSH names this server in known_hosts (and how messages name it).
    pub fn known_hosts_name(&self) -> String {
        known_hosts_name(&self.hostname, self.port)
    }
}

/// How OpenSSH names `hostname:port` in known_hosts: bare on port 22, else `[hostname]:port`.
pub(super) fn known_hosts_name(hostname: &str, port: u16) -> String {
    if port == 22 {
        hostname.to_string()
    } else {
        format!("[{hostname}]:{port}")
    }
}

/// Resolves `target` for the inventory host. Errors are messages for `RemoteError::Config`.
pub(super) fn resolve(
    target: &SshTarget,
    options: &BTreeMap<String, String>,
    home: Option<&Path>,
) -> Result<Resolved, String> {
    let options = normalise_options(options)?;
    let params = match home {
        Some(home) => read_user_config(home, &target.host)?,
        None => None,
    };
    let from_config =
        |get: fn(&ssh2_config::HostParams) -> Option<String>| params.as_ref().and_then(get);

    let hostname = options
        .get("hostname")
        .cloned()
        .or_else(|| from_config(|p| p.host_name.clone()))
        .unwrap_or_else(|| target.host.clone());
    let port = match options.get("port") {
        Some(p) => p
            .parse()
            .map_err(|_| format!("ssh_options Port {p:?} is not a port number"))?,
        None => target
            .port
            .or_else(|| params.as_ref().and_then(|p| p.port))
            .unwrap_or(22),
    };
    let user = options
        .get("user")
        .cloned()
        .or_else(|| target.user.clone())
        .or_else(|| from_config(|p| p.user.clone()))
        .or_else(local_user)
        .ok_or(
            "no user to log in as: write `user@host` in fleet.yaml or set User in ~/.ssh/config",
        )?;

    let expand = |p: &str| expand_tilde(p, home);
    let identity_files = match options.get("identityfile") {
        Some(p) => vec![expand(p)?],
        None => match params.as_ref().and_then(|p| p.identity_file.clone()) {
            Some(files) => files,
            None => match home {
                Some(home) => DEFAULT_IDENTITIES
                    .iter()
                    .map(|f| home.join(".ssh").join(f))
                    .filter(|p| p.exists())
                    .collect(),
                None => Vec::new(),
            },
        },
    };
    let known_hosts = match options.get("userknownhostsfile").cloned().or_else(|| {
        params.as_ref().and_then(|p| p.unsupported_fields.get("userknownhostsfile")).and_then(|v| v.first().cloned())
    }) {
        Some(p) => expand(&p)?,
        None => match home {
            Some(home) => home.join(".ssh").join("known_hosts"),
            None => return Err("$HOME is not set, so there is no ~/.ssh/known_hosts; set UserKnownHostsFile in ssh_options".into()),
        },
    };
    let connect_timeout = match options.get("connecttimeout") {
        Some(t) => Some(Duration::from_secs(t.parse().map_err(|_| {
            format!("ssh_options ConnectTimeout {t:?} is not a number of seconds")
        })?)),
        None => params.as_ref().and_then(|p| p.connect_timeout),
    };
    Ok(Resolved {
        hostname,
        port,
        user,
        identity_files,
        known_hosts,
        connect_timeout,
    })
}

fn normalise_options(
    options: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, String> {
    options
        .iter()
        .map(|(k, v)| {
            if SSH_OPTIONS.iter().any(|s| s.eq_ignore_ascii_case(k)) {
                Ok((k.to_ascii_lowercase(), v.clone()))
            } else {
                Err(format!(
                    "unsupported ssh_options key `{k}` (supported: {})",
                    SSH_OPTIONS.join(", ")
                ))
            }
        })
        .collect()
}

fn read_user_config(home: &Path, alias: &str) -> Result<Option<ssh2_config::HostParams>, String> {
    let path = home.join(".ssh").join("config");
    let file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let config = SshConfig::default()
        .home_dir(home)
        .parse(
            &mut BufReader::new(file),
            ParseRule::ALLOW_UNKNOWN_FIELDS | ParseRule::ALLOW_UNSUPPORTED_FIELDS,
        )
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(Some(config.query(alias)))
}

fn expand_tilde(path: &str, home: Option<&Path>) -> Result<PathBuf, String> {
    match path.strip_prefix('~') {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => {
            let home = home.ok_or_else(|| format!("cannot expand {path:?}: $HOME is not set"))?;
            Ok(home.join(rest.trim_start_matches('/')))
        }
        _ => Ok(PathBuf::from(path)),
    }
}

fn local_user() -> Option<String> {
    ["USER", "LOGNAME"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|u| !u.is_empty()))
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn ssh_config_fills_in_what_the_inventory_leaves_out() {
        let home = home_with_config(
            "Host ct-host\n  HostName 10.1.2.6\n  Port 2222\n  User admin\n  IdentityFile ~/.ssh/fleet_key\n  UserKnownHostsFile ~/.ssh/kh\n  ForwardX11 no\n",
        );
        let r = resolve(
            &target(None, "ct-host", None),
            &BTreeMap::new(),
            Some(home.path()),
        )
        .unwrap();
        assert_eq!(r.hostname, "10.1.2.6");
        assert_eq!(r.port, 2222);
        assert_eq!(r.user, "admin");
        assert_eq!(r.identity_files, vec![home.path().join(".ssh/fleet_key")]);
        assert_eq!(r.known_hosts, home.path().join(".ssh/kh"));
        assert_eq!(r.known_hosts_name(), "[10.1.2.6]:2222");
    }

    #[test]
    fn inventory_overrides_config_and_options_override_both() {
        let home = home_with_config("Host ct-host\n  Port 2222\n  User admin\n");
        let r = resolve(
            &target(Some("root"), "ct-host", Some(22)),
            &BTreeMap::new(),
            Some(home.path()),
        )
        .unwrap();
        assert_eq!(
            (r.user.as_str(), r.port, r.known_hosts_name()),
            ("root", 22, "ct-host".to_string())
        );
        let opts = BTreeMap::from([
            ("port".to_string(), "2200".to_string()),
            ("User".to_string(), "ops".to_string()),
        ]);
        let r = resolve(
            &target(Some("root"), "ct-host", Some(22)),
            &opts,
            Some(home.path()),
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
        let r = resolve(
            &target(Some("u"), "h", None),
            &BTreeMap::new(),
            Some(home.path()),
        )
        .unwrap();
        assert_eq!(
            r.identity_files,
            vec![
                home.path().join(".ssh/id_ed25519"),
                home.path().join(".ssh/id_rsa")
            ]
        );
    }

    #[test]
    fn connect_timeout_comes_from_options_then_config() {
        let home = home_with_config("Host ct-host\n  ConnectTimeout 7\n");
        let t = target(Some("u"), "ct-host", None);
        let r = resolve(&t, &BTreeMap::new(), Some(home.path())).unwrap();
        assert_eq!(r.connect_timeout, Some(Duration::from_secs(7)));
        let opts = BTreeMap::from([("ConnectTimeout".to_string(), "3".to_string())]);
        let r = resolve(&t, &opts, Some(home.path())).unwrap();
        assert_eq!(r.connect_timeout, Some(Duration::from_secs(3)));
        let r = resolve(
            &target(Some("u"), "other", None),
            &BTreeMap::new(),
            Some(home.path()),
        )
        .unwrap();
        assert_eq!(r.connect_timeout, None);
    }

    #[test]
    fn unknown_options_and_bad_ports_are_named() {
        let opts = BTreeMap::from([("ProxyJump".to_string(), "x".to_string())]);
        let err = resolve(&target(Some("u"), "h", None), &opts, None).unwrap_err();
        assert!(
            err.contains("`ProxyJump`") && err.contains("IdentityFile"),
            "{err}"
        );
        let opts = BTreeMap::from([("Port".to_string(), "http".to_string())]);
        let err = resolve(&target(Some("u"), "h", None), &opts, None).unwrap_err();
        assert!(err.contains("\"http\""), "{err}");
    }
}
