//! Reads `ssh_config(5)` files for one host the way OpenSSH does: `Host` and `Match` blocks,
//! `Include`, the first value obtained winning (IdentityFile accumulating), and where each value
//! came from (file and line), so that a refusal or a bad value can name its place.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use super::SshConfigError;

/// OpenSSH's limit on nested `Include`s (READCONF_MAX_DEPTH).
const MAX_INCLUDE_DEPTH: usize = 16;

/// Where a setting was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The inventory: `ssh:` or `ssh_options:` in fleet.yaml (OpenSSH's command line).
    Inventory,
    /// A line of an ssh_config file.
    File { path: PathBuf, line: usize },
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Inventory => write!(f, "fleet.yaml (ssh_options)"),
            Origin::File { path, line } => write!(f, "{}:{line}", path.display()),
        }
    }
}

/// One directive's value as obtained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    /// The keyword as written (for messages), e.g. `ProxyCommand`.
    pub keyword: String,
    pub args: Vec<String>,
    pub origin: Origin,
    /// Position among everything obtained: what OpenSSH means by "first".
    pub order: usize,
}

impl Setting {
    pub fn first_arg(&self) -> &str {
        self.args.first().map_or("", String::as_str)
    }
    pub fn joined(&self) -> String {
        self.args.join(" ")
    }
}

/// The directives in effect for one host, by lowercase keyword.
#[derive(Debug, Default)]
pub struct Settings {
    first: BTreeMap<String, Setting>,
    /// Every `IdentityFile`, in order: unlike other keywords they add up.
    identity_files: Vec<Setting>,
    next: usize,
}

impl Settings {
    /// Records a value unless one was obtained before (`IdentityFile` always adds).
    pub fn offer(&mut self, keyword: &str, args: Vec<String>, origin: Origin) {
        let key = keyword.to_ascii_lowercase();
        let setting = Setting {
            keyword: keyword.to_string(),
            args,
            origin,
            order: self.next,
        };
        self.next += 1;
        if key == "identityfile" {
            self.identity_files.push(setting);
        } else {
            self.first.entry(key).or_insert(setting);
        }
    }

    pub fn get(&self, key: &str) -> Option<&Setting> {
        self.first.get(key)
    }

    pub fn identity_files(&self) -> &[Setting] {
        &self.identity_files
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Setting)> {
        self.first.iter().map(|(k, s)| (k.as_str(), s))
    }
}

/// Who is asking: what `Host` and `Match` lines are evaluated against.
pub struct Query<'a> {
    /// The host name as given (the inventory's `ssh:` host or a ProxyJump entry).
    pub alias: &'a str,
    pub local_user: &'a str,
    /// `~` and relative `Include`s (against `~/.ssh`).
    pub home: &'a Path,
}

/// Applies `path` (a user config; a missing file is no config) to `settings`.
pub fn read_config(path: &Path, q: &Query, settings: &mut Settings) -> Result<(), SshConfigError> {
    match std::fs::read_to_string(path) {
        Ok(text) => read_text(&text, path, q, settings, 0),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(SshConfigError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn read_text(
    text: &str,
    path: &Path,
    q: &Query,
    settings: &mut Settings,
    depth: usize,
) -> Result<(), SshConfigError> {
    // Lines before the first Host or Match apply to every host.
    let mut active = true;
    for (i, raw) in text.lines().enumerate() {
        let origin = Origin::File {
            path: path.to_path_buf(),
            line: i + 1,
        };
        let Some((keyword, args)) = tokenize(raw).map_err(|message| SshConfigError::Syntax {
            origin: origin.clone(),
            message,
        })?
        else {
            continue;
        };
        match keyword.to_ascii_lowercase().as_str() {
            "host" => active = host_line_matches(&args, q.alias),
            "match" => active = match_line(&keyword, &args, q, settings, &origin)?,
            "include" if active => {
                if depth + 1 >= MAX_INCLUDE_DEPTH {
                    return Err(SshConfigError::Syntax {
                        origin,
                        message: format!("more than {MAX_INCLUDE_DEPTH} nested Includes"),
                    });
                }
                for pattern in &args {
                    for file in include_files(pattern, q.home, &origin)? {
                        let text = std::fs::read_to_string(&file).map_err(|source| {
                            SshConfigError::Read {
                                path: file.clone(),
                                source,
                            }
                        })?;
                        read_text(&text, &file, q, settings, depth + 1)?;
                    }
                }
            }
            _ if active => {
                if args.is_empty() {
                    return Err(SshConfigError::Syntax {
                        origin,
                        message: format!("`{keyword}` has no value"),
                    });
                }
                settings.offer(&keyword, args, origin);
            }
            _ => {}
        }
    }
    Ok(())
}

/// `keyword args...`, with `=` allowed after the keyword, double or single quotes, backslash
/// escapes, and a token starting with `#` ending the line. `None` for blank and comment lines.
pub fn tokenize(line: &str) -> Result<Option<(String, Vec<String>)>, String> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    let split = line
        .find(|c: char| c.is_whitespace() || c == '=')
        .unwrap_or(line.len());
    let keyword = line[..split].to_string();
    let mut rest = line[split..].trim_start();
    if let Some(after) = rest.strip_prefix('=') {
        rest = after;
    }
    let mut args = Vec::new();
    let mut chars = rest.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let Some(&first) = chars.peek() else { break };
        if first == '#' {
            break;
        }
        let mut word = String::new();
        let mut quote: Option<char> = None;
        while let Some(c) = chars.next() {
            match (quote, c) {
                (None, c) if c.is_whitespace() => break,
                (None, '"' | '\'') => quote = Some(c),
                (Some(q), c) if c == q => quote = None,
                (Some('\''), c) => word.push(c),
                (_, '\\') => match chars.next() {
                    Some(next) => word.push(next),
                    None => return Err("a line ends with a backslash".into()),
                },
                (_, c) => word.push(c),
            }
        }
        if quote.is_some() {
            return Err("unterminated quote".into());
        }
        args.push(word);
    }
    Ok(Some((keyword, args)))
}

/// A `Host` line: any positive pattern matches and no negated one does.
fn host_line_matches(patterns: &[String], alias: &str) -> bool {
    let alias = alias.to_ascii_lowercase();
    let mut matched = false;
    for p in patterns {
        let (negated, p) = match p.strip_prefix('!') {
            Some(rest) => (true, rest),
            None => (false, p.as_str()),
        };
        if wildcard(&p.to_ascii_lowercase(), &alias) {
            if negated {
                return false;
            }
            matched = true;
        }
    }
    matched
}

/// A comma-separated pattern list (`Match host a,!b*`).
fn pattern_list_matches(list: &str, value: &str) -> bool {
    host_line_matches(
        &list.split(',').map(String::from).collect::<Vec<_>>(),
        value,
    )
}

/// `*` any run, `?` one character.
pub fn wildcard(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// A `Match` line's criteria, all of which must hold. Those fleet can evaluate exactly as
/// OpenSSH does are; meeting any other while the line could still match is an error, since
/// guessing would apply (or skip) settings OpenSSH would not.
fn match_line(
    keyword: &str,
    args: &[String],
    q: &Query,
    settings: &Settings,
    origin: &Origin,
) -> Result<bool, SshConfigError> {
    let unsupported = |criterion: &str| SshConfigError::Refused {
        origin: origin.clone(),
        directive: format!("{keyword} {criterion}"),
        hint: "fleet evaluates only `Match all`, `host`, `originalhost`, `user` and `localuser`; \
               put these settings in a `Host` block, or in the host's ssh_options in fleet.yaml",
    };
    let mut unevaluable: Option<&String> = None;
    let mut words = args.iter().peekable();
    while let Some(word) = words.next() {
        let (negated, criterion) = match word.strip_prefix('!') {
            Some(rest) => (true, rest),
            None => (false, word.as_str()),
        };
        let lower = criterion.to_ascii_lowercase();
        let holds = match lower.as_str() {
            "all" => true,
            "host" | "originalhost" | "user" | "localuser" => {
                let Some(list) = words.next() else {
                    return Err(SshConfigError::Syntax {
                        origin: origin.clone(),
                        message: format!("`{keyword} {criterion}` needs a pattern list"),
                    });
                };
                let value = match lower.as_str() {
                    // After HostName substitution, as OpenSSH has it at this point.
                    "host" => settings
                        .get("hostname")
                        .map(|s| s.first_arg().replace("%h", q.alias).replace("%%", "%"))
                        .unwrap_or_else(|| q.alias.to_string()),
                    "originalhost" => q.alias.to_string(),
                    "user" => settings
                        .get("user")
                        .map(|s| s.first_arg().to_string())
                        .unwrap_or_else(|| q.local_user.to_string()),
                    _ => q.local_user.to_string(),
                };
                pattern_list_matches(list, &value)
            }
            _ => {
                // exec, canonical, final, localnetwork, tagged...: their arguments are
                // unknowable here, so the line can be decided only by a criterion that fails.
                unevaluable.get_or_insert(word);
                while words.next_if(|w| !is_criterion(w)).is_some() {}
                continue;
            }
        };
        if holds == negated {
            // Criteria are ANDed: one that fails decides, whatever the others say.
            return Ok(false);
        }
    }
    match unevaluable {
        Some(word) => Err(unsupported(word)),
        None => Ok(true),
    }
}

/// Whether a word of a `Match` line starts a criterion (a guess needed only after a criterion
/// fleet skips, whose argument count it does not know).
fn is_criterion(word: &str) -> bool {
    const CRITERIA: &[&str] = &[
        "all",
        "canonical",
        "final",
        "exec",
        "localnetwork",
        "host",
        "originalhost",
        "tagged",
        "user",
        "localuser",
        "version",
        "command",
        "sessiontype",
    ];
    let w = word.strip_prefix('!').unwrap_or(word);
    CRITERIA.iter().any(|c| c.eq_ignore_ascii_case(w))
}

/// The files an `Include` names: `~` is the home, relative paths are under `~/.ssh`, and
/// `*`/`?` in the last component pick files in lexical order (as glob(3) does).
fn include_files(
    pattern: &str,
    home: &Path,
    origin: &Origin,
) -> Result<Vec<PathBuf>, SshConfigError> {
    let path = match pattern.strip_prefix("~/") {
        Some(rest) => home.join(rest),
        None if pattern.starts_with('/') => PathBuf::from(pattern),
        None => home.join(".ssh").join(pattern),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let dir = path.parent().unwrap_or(Path::new("/"));
    if dir.to_string_lossy().contains(['*', '?']) {
        return Err(SshConfigError::Refused {
            origin: origin.clone(),
            directive: format!("Include {pattern}"),
            hint: "fleet expands wildcards only in the file name of an Include, not in its \
                   directories; list the directories",
        });
    }
    if !name.contains(['*', '?']) {
        return Ok(if path.is_file() { vec![path] } else { vec![] });
    }
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok())
            .filter(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                // glob(3) leaves dot files to patterns that start with a dot.
                (name.starts_with('.') || !n.starts_with('.')) && wildcard(&name, &n)
            })
            .map(|e| e.path())
            .filter(|p| p.is_file())
            .collect(),
        Err(_) => Vec::new(),
    };
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn effective(files: &[(&str, &str)], alias: &str, preset: &[(&str, &str)]) -> Settings {
        try_effective(files, alias, preset).unwrap()
    }

    fn try_effective(
        files: &[(&str, &str)],
        alias: &str,
        preset: &[(&str, &str)],
    ) -> Result<Settings, SshConfigError> {
        let home = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(home.path().join(".ssh/conf.d")).unwrap();
        for (name, text) in files {
            std::fs::write(home.path().join(".ssh").join(name), text).unwrap();
        }
        let mut s = Settings::default();
        for (k, v) in preset {
            s.offer(k, vec![v.to_string()], Origin::Inventory);
        }
        let q = Query {
            alias,
            local_user: "me",
            home: home.path(),
        };
        read_config(&home.path().join(".ssh/config"), &q, &mut s)?;
        Ok(s)
    }

    fn value(s: &Settings, key: &str) -> Option<String> {
        s.get(key).map(Setting::joined)
    }

    fn line(s: &Settings, key: &str) -> usize {
        match &s.get(key).unwrap().origin {
            Origin::File { line, .. } => *line,
            Origin::Inventory => 0,
        }
    }

    #[test]
    fn lines_split_like_openssh() {
        let t = |l: &str| tokenize(l).unwrap();
        assert_eq!(t("  # note"), None);
        assert_eq!(t(""), None);
        assert_eq!(
            t("HostName=10.1.2.6 # the pve host"),
            Some(("HostName".into(), vec!["10.1.2.6".into()]))
        );
        assert_eq!(
            t("IdentityFile \"~/my keys/id\""),
            Some(("IdentityFile".into(), vec!["~/my keys/id".into()]))
        );
        assert_eq!(
            t("ProxyCommand = ssh -W %h:%p 'jump host' a\\ b"),
            Some((
                "ProxyCommand".into(),
                ["ssh", "-W", "%h:%p", "jump host", "a b"]
                    .map(String::from)
                    .into()
            ))
        );
        assert!(tokenize("User \"root").is_err());
    }

    #[test]
    fn wildcards() {
        assert!(wildcard("*", "anything"));
        assert!(wildcard("pve*", "pve2"));
        assert!(wildcard("10.1.?.6", "10.1.2.6"));
        assert!(wildcard("*.lab", "a.b.lab"));
        assert!(!wildcard("*.lab", "lab"));
        assert!(!wildcard("pve", "pve2"));
        assert!(wildcard("a*b*c", "aXbYbZc"));
    }

    #[test]
    fn the_first_value_wins_and_lines_are_kept() {
        let s = effective(
            &[(
                "config",
                "User early\nHost pve\n  HostName 10.1.2.6\n  User root\nHost *\n  User other\n  HostName nope\n  Port 2222\n",
            )],
            "pve",
            &[],
        );
        assert_eq!(value(&s, "user").as_deref(), Some("early"));
        assert_eq!(value(&s, "hostname").as_deref(), Some("10.1.2.6"));
        assert_eq!(line(&s, "hostname"), 3);
        assert_eq!(value(&s, "port").as_deref(), Some("2222"));
        assert_eq!(line(&s, "port"), 8);
    }

    #[test]
    fn host_patterns_negation_and_case() {
        let cfg = "Host pve* !pve-old\n  User root\nHost PVE-OLD\n  User legacy\n";
        let s = effective(&[("config", cfg)], "pve2", &[]);
        assert_eq!(value(&s, "user").as_deref(), Some("root"));
        let s = effective(&[("config", cfg)], "pve-old", &[]);
        assert_eq!(value(&s, "user").as_deref(), Some("legacy"));
        let s = effective(&[("config", cfg)], "other", &[]);
        assert_eq!(value(&s, "user"), None);
    }

    #[test]
    fn the_inventory_comes_first_like_the_command_line() {
        let s = effective(
            &[("config", "Host pve\n  User admin\n  Port 22\n")],
            "pve",
            &[("User", "root")],
        );
        assert_eq!(value(&s, "user").as_deref(), Some("root"));
        assert_eq!(s.get("user").unwrap().origin, Origin::Inventory);
    }

    #[test]
    fn identity_files_add_up_in_order() {
        let s = effective(
            &[(
                "config",
                "Host pve\n  IdentityFile ~/.ssh/a\nHost *\n  IdentityFile ~/.ssh/b\n",
            )],
            "pve",
            &[],
        );
        let files: Vec<_> = s.identity_files().iter().map(Setting::joined).collect();
        assert_eq!(files, ["~/.ssh/a", "~/.ssh/b"]);
    }

    #[test]
    fn includes_apply_in_place_with_their_own_lines() {
        let s = effective(
            &[
                ("config", "Host pve\n  Include conf.d/*.conf\n  User late\n"),
                ("conf.d/10-a.conf", "\nProxyJump bastion\n"),
                ("conf.d/20-b.conf", "User from-b\nHost other\n  Port 1\n"),
                ("conf.d/.hidden.conf", "Port 9\n"),
            ],
            "pve",
            &[],
        );
        assert_eq!(value(&s, "proxyjump").as_deref(), Some("bastion"));
        let Origin::File { path, line } = &s.get("proxyjump").unwrap().origin else {
            panic!()
        };
        assert!(path.ends_with("conf.d/10-a.conf") && *line == 2, "{path:?}");
        assert_eq!(value(&s, "user").as_deref(), Some("from-b"));
        assert_eq!(value(&s, "port"), None);
        // An Include inside a block that does not apply is not read.
        let s = effective(
            &[
                ("config", "Host elsewhere\n  Include conf.d/x\n"),
                ("conf.d/x", "User x\n"),
            ],
            "pve",
            &[],
        );
        assert_eq!(value(&s, "user"), None);
    }

    #[test]
    fn match_is_evaluated_where_openssh_is_certain_and_refused_elsewhere() {
        let cfg = "Host pve\n  HostName 10.1.2.6\nMatch host 10.1.*,!10.1.9.* user root\n  Port 2200\nMatch originalhost pve localuser me\n  ForwardAgent no\nMatch all\n  Compression yes\n";
        let s = effective(&[("config", cfg)], "pve", &[("User", "root")]);
        assert_eq!(value(&s, "port").as_deref(), Some("2200"));
        assert_eq!(value(&s, "forwardagent").as_deref(), Some("no"));
        assert_eq!(value(&s, "compression").as_deref(), Some("yes"));
        let s = effective(&[("config", cfg)], "pve", &[("User", "admin")]);
        assert_eq!(value(&s, "port"), None);
        // A failed criterion decides before an unevaluable one is reached.
        let s = effective(
            &[("config", "Match host other exec \"test -e /x\"\n  Port 1\n")],
            "pve",
            &[],
        );
        assert_eq!(value(&s, "port"), None);
        let s = effective(
            &[(
                "config",
                "Match exec \"true\" !all\n  Port 1\nMatch final host other\n  Port 2\n",
            )],
            "pve",
            &[],
        );
        assert_eq!(value(&s, "port"), None);
        let err = try_effective(
            &[(
                "config",
                "Host x\n  User y\nMatch host pve exec \"nc -z %h 22\"\n  ProxyJump b\n",
            )],
            "pve",
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains(".ssh/config:3") && err.contains("Match exec"),
            "{err}"
        );
    }

    #[test]
    fn syntax_errors_name_the_line() {
        let err = try_effective(&[("config", "Host pve\n  User\n")], "pve", &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(".ssh/config:2") && err.contains("`User` has no value"),
            "{err}"
        );
    }
}
