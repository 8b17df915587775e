//! The launcher's `--help` kept on its host between runs, keyed on what decides its text: the
//! launcher's argv, the profile's environment, the launcher executable's size, mtime and inode,
//! and, for a `python -m` launcher, the SGLang version and its `server_args.py` (where the
//! options are defined). The real server's `--help` imports torch and sglang: tens of seconds a
//! by-hand start never pays, on every `up` and every sweep candidate's restart.
//!
//! Any change of those is a new key, so an upgrade, an edited launcher or another venv reads
//! `--help` again; a cache that cannot be read or written is only a slower start.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use crate::remote::{Transport, argv};

/// The cache directory of a host: beside its run root, not in it, so that a preflight that
/// refuses leaves the run root as it found it.
pub fn dir(run_root: &str) -> String {
    format!("{}.preflight", run_root.trim_end_matches('/'))
}

/// What identifies the launcher executable: `size mtime(ns) inode` of what `$1` resolves to on
/// PATH, or nothing when it resolves to nothing; then, in the same command, every `--help` kept
/// in `$2` as `NUL name NUL text`. The key a cached text is read by needs this identity, and a
/// second command only to read one file would cost a second `pct exec` on a Proxmox host.
const EXE_SCRIPT: &str = r#"p=$(command -v -- "$1") && stat -L -c '%s %y %i' -- "$p"
found=$?
for f in "$2"/*.help; do [ -f "$f" ] && printf '\000%s\000' "${f##*/}" && cat -- "$f"; done
exit $found"#;

/// How many `--help` texts a host keeps: one per launcher, environment and version in use,
/// the most recently written first.
const KEPT: usize = 8;

/// The second line `preflight`'s version script prints: the size and mtime of sglang's
/// `server_args.py` (its options' definitions), found without importing sglang.
pub const SERVER_ARGS_STAT: &str = "\nimport os\ntry:\n    s = os.stat(m.distribution('sglang').locate_file('sglang/srt/server_args.py'))\n    print(s.st_size, s.st_mtime_ns)\nexcept Exception:\n    print('')";

/// The launcher executable as `with_env` runs it, and the texts its host keeps.
#[derive(Debug, Default, PartialEq)]
pub struct Looked {
    /// `None` when it cannot be read: then nothing is cached or looked up.
    pub identity: Option<String>,
    /// By key.
    pub cached: BTreeMap<String, String>,
}

/// Reads the launcher's identity and the cache in `dir` in one command.
pub async fn look(
    t: &dyn Transport,
    with_env: impl Fn(Vec<String>) -> Vec<String>,
    launcher: &[String],
    dir: &str,
) -> Looked {
    let Some(exe) = launcher.first() else {
        return Looked::default();
    };
    match t
        .run(&with_env(argv(&["sh", "-c", EXE_SCRIPT, "sh", exe, dir])))
        .await
    {
        Ok(out) => parse_look(out.success(), &out.stdout_lossy()),
        Err(_) => Looked::default(),
    }
}

fn parse_look(success: bool, stdout: &str) -> Looked {
    let mut fields = stdout.split('\0');
    let id = fields.next().unwrap_or("").trim().to_string();
    let mut cached = BTreeMap::new();
    while let (Some(name), Some(text)) = (fields.next(), fields.next()) {
        if let Some(key) = name.strip_suffix(".help")
            && !text.trim().is_empty()
        {
            cached.insert(key.to_string(), text.to_string());
        }
    }
    Looked {
        identity: (success && !id.is_empty()).then_some(id),
        cached,
    }
}

/// The cache key of a `--help` read with `launcher` and `env` (as `KEY=VALUE`, sorted) on a
/// launcher identified by `parts` (its executable, the version details); hex, file-name safe.
pub fn key(launcher: &[String], env: &[String], parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for field in launcher
        .iter()
        .chain(["\0env".to_string()].iter())
        .chain(env)
    {
        h.update(field.as_bytes());
        h.update([0]);
    }
    for p in parts {
        h.update(b"\0part\0");
        h.update(p.as_bytes());
    }
    h.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn path(dir: &str, key: &str) -> String {
    format!("{dir}/{key}.help")
}

/// Keeps `text` for `key`, written aside and renamed so that a reader never sees half of it,
/// and only the [`KEPT`] most recent texts, since every look reads them all.
pub async fn store(t: &dyn Transport, dir: &str, key: &str, text: &str) {
    let script = r#"umask 077 && mkdir -p -- "$1" && cat > "$2.tmp.$$" && mv -f -- "$2.tmp.$$" "$2" || exit 1
cd -- "$1" && ls -t -- *.help | tail -n +"$3" | while IFS= read -r f; do rm -f -- "$f"; done"#;
    let file = path(dir, key);
    let after = (KEPT + 1).to_string();
    let stored = t
        .run_input(
            &argv(&["sh", "-c", script, "sh", dir, &file, &after]),
            text.as_bytes(),
        )
        .await;
    match stored {
        Ok(out) if out.success() => {}
        Ok(out) => tracing::debug!(
            "{}: cannot cache --help in {dir}: {}",
            t.host(),
            out.stderr_lossy().trim()
        ),
        Err(e) => tracing::debug!("{}: cannot cache --help in {dir}: {e}", t.host()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn the_key_changes_with_the_launcher_its_env_and_every_part() {
        let l = s(&["python", "-m", "sglang.launch_server"]);
        let base = key(&l, &s(&["A=1"]), &["1 2 3", "0.5.23"]);
        assert_eq!(base, key(&l, &s(&["A=1"]), &["1 2 3", "0.5.23"]));
        assert_eq!(base.len(), 32);
        assert!(base.chars().all(|c| c.is_ascii_hexdigit()));
        for other in [
            key(
                &s(&["python3", "-m", "sglang.launch_server"]),
                &s(&["A=1"]),
                &["1 2 3", "0.5.23"],
            ),
            key(&l, &s(&["A=2"]), &["1 2 3", "0.5.23"]),
            key(&l, &[], &["1 2 3", "0.5.23"]),
            key(&l, &s(&["A=1"]), &["1 2 4", "0.5.23"]),
            key(&l, &s(&["A=1"]), &["1 2 3", "0.5.24"]),
            // Fields cannot slide into each other.
            key(
                &s(&["python", "-m"]),
                &s(&["sglang.launch_server", "A=1"]),
                &["1 2 3", "0.5.23"],
            ),
        ] {
            assert_ne!(base, other);
        }
        assert_eq!(dir("/tmp/fleet/"), "/tmp/fleet.preflight");
    }

    #[test]
    fn a_look_reads_the_identity_and_every_kept_text() {
        let out = "123 2026-12-05 10:00:00.000000000 +0000 42\n\0aa.help\0usage: a\n\0bb.help\0usage: b\n";
        let looked = parse_look(true, out);
        assert_eq!(
            looked.identity.as_deref(),
            Some("123 2026-12-05 10:00:00.000000000 +0000 42")
        );
        assert_eq!(looked.cached.len(), 2);
        assert_eq!(looked.cached["bb"], "usage: b\n");
        // A launcher not on PATH: no identity, so nothing is looked up by it.
        let looked = parse_look(false, "\0aa.help\0usage: a\n");
        assert_eq!(looked.identity, None);
        assert_eq!(parse_look(true, ""), Looked::default());
    }
}
