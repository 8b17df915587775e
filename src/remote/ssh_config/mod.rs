//! Where, how and as whom to connect, resolved the OpenSSH way: the inventory's `ssh:` and
//! `ssh_options` come first (they are OpenSSH's command line), then `~/.ssh/config` (`~` is
//! `$HOME`), then the defaults (port 22, the local user, `~/.ssh/id_{ed25519,ecdsa,rsa}`,
//! `~/.ssh/known_hosts`, a keepalive every 15 s). A `ProxyJump` becomes a chain of hops, each
//! resolved the same way; a directive fleet does not implement but which would change the
//! connection is refused with its file and line (see [`directives`]).

pub mod directives;
mod scan;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::{SSH_OPTIONS, SshTarget, parse_ssh_target};

pub use scan::Origin;
use scan::{Query, Setting, Settings};

const DEFAULT_IDENTITIES: [&str; 3] = ["id_ed25519", "id_ecdsa", "id_rsa"];

/// fleet's keepalive when neither fleet.yaml nor `~/.ssh/config` sets one: OpenSSH sends none
/// by default, but a days-long job must notice a silently dead link.
pub const DEFAULT_KEEPALIVE: Keepalive = Keepalive {
    interval: Some(Duration::from_secs(15)),
    max: 3,
};

/// Jump chains longer than this are almost surely a loop through wildcard `Host` blocks.
const MAX_HOPS: usize = 8;

/// Why a host's SSH settings cannot be used. Each names the file and line (or fleet.yaml).
#[derive(Debug, thiserror::Error)]
pub enum SshConfigError {
    #[error("{origin}: `{directive}` is not supported by fleet\n  hint: {hint}")]
    Refused {
        origin: Origin,
        directive: String,
        hint: &'static str,
    },
    #[error(
        "{origin}: `{keyword}` is not an ssh_config option fleet knows\n  hint: if OpenSSH \
         knows it and it does not change where, how or as whom to connect, name it in an \
         `IgnoreUnknown` line above this one"
    )]
    Unknown { origin: Origin, keyword: String },
    #[error("{origin}: {keyword} {value:?}: {message}")]
    Invalid {
        origin: Origin,
        keyword: String,
        value: String,
        message: String,
    },
    #[error("{origin}: {message}")]
    Syntax { origin: Origin, message: String },
    #[error("cannot read {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("ProxyJump loop: {}\n  hint: give the jump host its own `Host` block with `ProxyJump none`", .chain.join(" -> "))]
    JumpLoop { chain: Vec<String> },
    #[error(
        "no user to log in as to {alias}: write `user@host` in fleet.yaml or set User in \
         ~/.ssh/config"
    )]
    NoUser { alias: String },
    #[error(
        "$HOME is not set, so there is no ~/.ssh/known_hosts; set UserKnownHostsFile in the \
         host's ssh_options"
    )]
    NoHome,
}

/// How often to probe a quiet connection, and how many unanswered probes mean it is dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    /// `None`: no keepalives (`ServerAliveInterval 0`).
    pub interval: Option<Duration>,
    pub max: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Resolved {
    /// The name the hop was given by (the inventory's `ssh:` host, a ProxyJump entry).
    pub alias: String,
    /// The address to connect to (HostName), also the name looked up in known_hosts.
    pub hostname: String,
    pub port: u16,
    pub user: String,
    /// Keys to offer, in order. Explicit `IdentityFile`s replace the defaults, as in OpenSSH.
    pub identity_files: Vec<PathBuf>,
    /// `IdentitiesOnly yes`: offer agent keys only where they are one of `identity_files`.
    pub identities_only: bool,
    pub known_hosts: PathBuf,
    /// `ConnectTimeout` from ssh_options or `~/.ssh/config`; else `--connect-timeout`.
    pub connect_timeout: Option<Duration>,
    pub keepalive: Keepalive,
    /// The hop this one is reached through (`ProxyJump`), itself resolved in full.
    pub jump: Option<Box<Resolved>>,
}

impl Resolved {
    /// How OpenSSH names this server in known_hosts (and how messages name it).
    pub fn known_hosts_name(&self) -> String {
        known_hosts_name(&self.hostname, self.port)
    }

    /// `user@hostname:port`, and the hops before it: what makes two jump connections one.
    pub fn identity(&self) -> String {
        let mut id = format!("{}@{}", self.user, self.known_hosts_name());
        if let Some(j) = &self.jump {
            id = format!("{id} via {}", j.identity());
        }
        id
    }

    /// The aliases of the jump hosts, first hop first.
    pub fn hops(&self) -> Vec<String> {
        let mut hops = Vec::new();
        let mut j = self.jump.as_deref();
        while let Some(hop) = j {
            hops.insert(0, hop.alias.clone());
            j = hop.jump.as_deref();
        }
        hops
    }
}

/// How OpenSSH names `hostname:port` in known_hosts: bare on port 22, else `[hostname]:port`.
pub(crate) fn known_hosts_name(hostname: &str, port: u16) -> String {
    if port == 22 {
        hostname.to_string()
    } else {
        format!("[{hostname}]:{port}")
    }
}

/// Resolves `target` for an inventory host, with its `ssh_options`, and its jump hosts.
pub(crate) fn resolve(
    target: &SshTarget,
    options: &BTreeMap<String, String>,
    home: Option<&Path>,
) -> Result<Resolved, SshConfigError> {
    let mut given = Settings::default();
    for (key, value) in options {
        let Some(name) = SSH_OPTIONS.iter().find(|o| o.eq_ignore_ascii_case(key)) else {
            return Err(SshConfigError::Unknown {
                origin: Origin::Inventory,
                keyword: key.clone(),
            });
        };
        given.offer(name, vec![value.clone()], Origin::Inventory);
    }
    offer_target(&mut given, target);
    let mut chain = Vec::new();
    resolve_host(&target.host, given, None, home, &mut chain)
}

fn offer_target(settings: &mut Settings, target: &SshTarget) {
    if let Some(user) = &target.user {
        settings.offer("User", vec![user.clone()], Origin::Inventory);
    }
    if let Some(port) = target.port {
        settings.offer("Port", vec![port.to_string()], Origin::Inventory);
    }
}

/// `forced`: the hops a ProxyJump list put before this one, which override its own (as
/// OpenSSH's `-J` on the command line of the hop would).
fn resolve_host(
    alias: &str,
    mut s: Settings,
    forced: Option<&[(SshTarget, Origin)]>,
    home: Option<&Path>,
    chain: &mut Vec<String>,
) -> Result<Resolved, SshConfigError> {
    let local_user = local_user();
    if let Some(home) = home {
        let q = Query {
            alias,
            local_user: local_user.as_deref().unwrap_or(""),
            home,
        };
        scan::read_config(&home.join(".ssh").join("config"), &q, &mut s)?;
    }
    check_policies(&s, forced.is_some())?;

    let hostname = match s.get("hostname") {
        Some(h) => h.first_arg().replace("%h", alias).replace("%%", "%"),
        None => alias.to_string(),
    };
    let port = match s.get("port") {
        Some(p) => p
            .first_arg()
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| invalid(p, "not a port number (1-65535)"))?,
        None => 22,
    };
    let user = s
        .get("user")
        .map(|u| u.first_arg().to_string())
        .or_else(|| local_user.clone())
        .ok_or_else(|| SshConfigError::NoUser {
            alias: alias.to_string(),
        })?;
    let tokens = Tokens {
        alias,
        hostname: &hostname,
        port,
        user: &user,
        local_user: local_user.as_deref().unwrap_or(""),
        home,
    };
    let mut identity_files = Vec::new();
    for f in s.identity_files() {
        identity_files.push(tokens.path(f, f.first_arg())?);
    }
    if identity_files.is_empty()
        && let Some(home) = home
    {
        identity_files = DEFAULT_IDENTITIES
            .iter()
            .map(|f| home.join(".ssh").join(f))
            .filter(|p| p.exists())
            .collect();
    }
    let known_hosts = match s.get("userknownhostsfile") {
        Some(k) => tokens.path(k, k.first_arg())?,
        None => home
            .map(|h| h.join(".ssh").join("known_hosts"))
            .ok_or(SshConfigError::NoHome)?,
    };
    let connect_timeout = match s.get("connecttimeout") {
        Some(t) if t.first_arg().eq_ignore_ascii_case("none") => None,
        Some(t) => Some(parse_time(t)?),
        None => None,
    };
    let keepalive = Keepalive {
        interval: match s.get("serveraliveinterval") {
            Some(i) => Some(parse_time(i)?).filter(|d| !d.is_zero()),
            None => DEFAULT_KEEPALIVE.interval,
        },
        max: match s.get("serveralivecountmax") {
            Some(m) => m
                .first_arg()
                .parse()
                .map_err(|_| invalid(m, "not a count"))?,
            None => DEFAULT_KEEPALIVE.max,
        },
    };
    let identities_only = match s.get("identitiesonly") {
        Some(flag) => parse_flag(flag)?,
        None => false,
    };

    chain.push(alias.to_string());
    let hops: Vec<(SshTarget, Origin)> = match forced {
        Some(hops) => hops.to_vec(),
        None => proxy_jump(&s)?,
    };
    let jump = match hops.split_last() {
        None => None,
        Some(((hop, _), before)) => {
            if chain.iter().any(|a| a.eq_ignore_ascii_case(&hop.host)) || chain.len() > MAX_HOPS {
                let mut chain = chain.clone();
                chain.push(hop.host.clone());
                return Err(SshConfigError::JumpLoop { chain });
            }
            let mut given = Settings::default();
            offer_target(&mut given, hop);
            // The first hop of a list reads its own ProxyJump; later ones are reached through
            // the hops listed before them.
            let forced = (!before.is_empty()).then_some(before);
            Some(Box::new(resolve_host(
                &hop.host, given, forced, home, chain,
            )?))
        }
    };
    chain.pop();
    Ok(Resolved {
        alias: alias.to_string(),
        hostname,
        port,
        user,
        identity_files,
        identities_only,
        known_hosts,
        connect_timeout,
        keepalive,
        jump,
    })
}

/// Refuses what would change the connection if dropped, and what OpenSSH itself rejects.
fn check_policies(s: &Settings, jump_forced: bool) -> Result<(), SshConfigError> {
    for (key, setting) in s.iter() {
        match directives::policy(key) {
            Some(directives::Policy::Refused { unless, hint }) => {
                let value = setting.first_arg().to_ascii_lowercase();
                // A ProxyJump obtained first (or forced by a jump list) wins over it, as in
                // OpenSSH, so it is then no change of route.
                let overridden = key == "proxycommand"
                    && (jump_forced || s.get("proxyjump").is_some_and(|j| j.order < setting.order));
                if !unless.contains(&value.as_str()) && !overridden {
                    return Err(SshConfigError::Refused {
                        origin: setting.origin.clone(),
                        directive: format!("{} {}", setting.keyword, setting.joined()),
                        hint,
                    });
                }
            }
            Some(_) => {}
            None if !ignored_unknown(s, setting) => {
                return Err(SshConfigError::Unknown {
                    origin: setting.origin.clone(),
                    keyword: setting.keyword.clone(),
                });
            }
            None => {}
        }
    }
    Ok(())
}

/// `IgnoreUnknown` covers keywords that come after it.
fn ignored_unknown(s: &Settings, setting: &Setting) -> bool {
    s.get("ignoreunknown").is_some_and(|ig| {
        ig.order < setting.order
            && ig.args.iter().flat_map(|a| a.split(',')).any(|p| {
                scan::wildcard(
                    &p.to_ascii_lowercase(),
                    &setting.keyword.to_ascii_lowercase(),
                )
            })
    })
}

/// The jump hosts of `ProxyJump a,b` (`none`: none), unless a `ProxyCommand` came first.
fn proxy_jump(s: &Settings) -> Result<Vec<(SshTarget, Origin)>, SshConfigError> {
    let Some(j) = s.get("proxyjump") else {
        return Ok(Vec::new());
    };
    if s.get("proxycommand").is_some_and(|c| c.order < j.order)
        || j.first_arg().eq_ignore_ascii_case("none")
    {
        return Ok(Vec::new());
    }
    j.first_arg()
        .split(',')
        .map(|hop| {
            let hop = hop.strip_prefix("ssh://").unwrap_or(hop);
            parse_ssh_target(hop)
                .map(|t| (t, j.origin.clone()))
                .map_err(|e| invalid(j, &e.to_string()))
        })
        .collect()
}

fn invalid(s: &Setting, message: &str) -> SshConfigError {
    SshConfigError::Invalid {
        origin: s.origin.clone(),
        keyword: s.keyword.clone(),
        value: s.joined(),
        message: message.to_string(),
    }
}

fn parse_flag(s: &Setting) -> Result<bool, SshConfigError> {
    match s.first_arg().to_ascii_lowercase().as_str() {
        "yes" | "true" => Ok(true),
        "no" | "false" => Ok(false),
        _ => Err(invalid(s, "expected yes or no")),
    }
}

/// OpenSSH's time format: seconds, or numbers with s, m, h, d, w units (`1m30s`).
fn parse_time(s: &Setting) -> Result<Duration, SshConfigError> {
    let text = s.first_arg();
    let bad = || invalid(s, "not a time (seconds, or e.g. 30s, 5m, 1h)");
    let mut total = 0u64;
    let mut digits = String::new();
    for c in text.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit = match c.to_ascii_lowercase() {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            'w' => 604_800,
            _ => return Err(bad()),
        };
        let n: u64 = digits.parse().map_err(|_| bad())?;
        total = total.saturating_add(n.saturating_mul(unit));
        digits.clear();
    }
    if !digits.is_empty() {
        total = total.saturating_add(digits.parse::<u64>().map_err(|_| bad())?);
    } else if text.is_empty() || !text.ends_with(|c: char| c.is_ascii_alphabetic()) {
        return Err(bad());
    }
    Ok(Duration::from_secs(total))
}

/// What `%` tokens and `~` stand for in IdentityFile and UserKnownHostsFile.
struct Tokens<'a> {
    alias: &'a str,
    hostname: &'a str,
    port: u16,
    user: &'a str,
    local_user: &'a str,
    home: Option<&'a Path>,
}

impl Tokens<'_> {
    fn path(&self, s: &Setting, value: &str) -> Result<PathBuf, SshConfigError> {
        let home = || {
            self.home
                .map(|h| h.display().to_string())
                .ok_or(SshConfigError::NoHome)
        };
        let mut out = String::new();
        let mut chars = value.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '%' => match chars.next() {
                    Some('%') => out.push('%'),
                    Some('h') => out.push_str(self.hostname),
                    Some('n') => out.push_str(self.alias),
                    Some('p') => out.push_str(&self.port.to_string()),
                    Some('r') => out.push_str(self.user),
                    Some('u') => out.push_str(self.local_user),
                    Some('d') => out.push_str(&home()?),
                    // SAFETY: getuid cannot fail and touches no memory.
                    Some('i') => out.push_str(&unsafe { libc::getuid() }.to_string()),
                    other => {
                        let token = other.map(|c| format!("%{c}")).unwrap_or("%".into());
                        return Err(invalid(
                            s,
                            &format!(
                                "fleet does not expand `{token}` (only %%, %d, %h, %i, %n, %p, %r, %u)"
                            ),
                        ));
                    }
                },
                '$' if chars.peek() == Some(&'{') => {
                    chars.next();
                    let name: String = chars.by_ref().take_while(|c| *c != '}').collect();
                    let v = std::env::var(&name).map_err(|_| {
                        invalid(s, &format!("environment variable {name} is not set"))
                    })?;
                    out.push_str(&v);
                }
                c => out.push(c),
            }
        }
        match out.strip_prefix('~') {
            Some(rest) if rest.is_empty() || rest.starts_with('/') => {
                Ok(PathBuf::from(home()?).join(rest.trim_start_matches('/')))
            }
            _ => Ok(PathBuf::from(out)),
        }
    }
}

/// `$USER` (or `$LOGNAME`), else the password database's name for this uid, as OpenSSH has it.
pub(crate) fn local_user() -> Option<String> {
    ["USER", "LOGNAME"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|u| !u.is_empty()))
        .or_else(user_of_uid)
}

fn user_of_uid() -> Option<String> {
    let mut buf = vec![0 as libc::c_char; 4096];
    // SAFETY: a zeroed passwd is a valid out-parameter; getpwuid_r writes its strings into
    // `buf` (whose length it is told) and sets `found` to `pw` only on success.
    unsafe {
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwuid_r(
            libc::getuid(),
            &mut pw,
            buf.as_mut_ptr(),
            buf.len(),
            &mut found,
        );
        if rc != 0 || found.is_null() || pw.pw_name.is_null() {
            return None;
        }
        std::ffi::CStr::from_ptr(pw.pw_name)
            .to_str()
            .ok()
            .map(String::from)
    }
}

#[cfg(test)]
mod tests;
