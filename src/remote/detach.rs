//! The one implementation of "start a detached process" shared by every transport: a small
//! POSIX sh script, run through the transport like any argv, that starts the process with
//! `setsid -f` and reports the pid the process itself wrote to the pidfile.

use super::{CommandOutput, Detached, RemoteError, mask};

/// `$1` log, `$2` pidfile, then `env` arguments (`-- NAME=VALUE... argv...`). The inner `sh`
/// writes its own pid (it then `exec`s the program, keeping the pid, which `setsid` made a
/// session and process-group leader) through a temp file and `mv`, so a reader never sees a
/// half-written pidfile. The outer script waits up to 10 s for that file, then prints the pid
/// and the process's `/proc` stat line (its start time tells it from a later process of the same
/// pid: read here, it costs no second command on the host).
const SCRIPT: &str = r#"log=$1; pidfile=$2; shift 2
mkdir -p -- "$(dirname -- "$log")" "$(dirname -- "$pidfile")" || exit 1
rm -f -- "$pidfile"
setsid -f sh -c 'echo $$ >"$0.tmp" && mv -f -- "$0.tmp" "$0" && exec env "$@"' "$pidfile" "$@" \
  </dev/null >"$log" 2>&1 || exit 1
i=0
while [ ! -s "$pidfile" ]; do
  i=$((i + 1))
  if [ "$i" -gt 1000 ]; then echo "no pid in $pidfile after 10s" >&2; exit 1; fi
  sleep 0.01
done
pid=$(cat -- "$pidfile")
echo "$pid"
cat -- "/proc/$pid/stat" 2>/dev/null
true"#;

/// The argv that starts `d` detached; every value travels as a separate argument.
pub fn spawn_argv(host: &str, d: &Detached) -> Result<Vec<String>, RemoteError> {
    let bad = |message: String| RemoteError::Command {
        host: host.to_string(),
        command: mask(&d.argv.join(" ")),
        status: "not started".into(),
        stderr: message,
    };
    let Some(program) = d.argv.first() else {
        return Err(bad("empty command".into()));
    };
    if program.contains('=') {
        return Err(bad(format!(
            "program name {program:?} contains '=', which env would read as a variable"
        )));
    }
    let mut argv: Vec<String> = ["sh", "-c", SCRIPT, "fleet-spawn", &d.log, &d.pidfile, "--"]
        .map(String::from)
        .into();
    for (name, value) in &d.env {
        if !valid_env_name(name) {
            return Err(bad(format!("invalid environment variable name {name:?}")));
        }
        argv.push(format!("{name}={value}"));
    }
    argv.extend(d.argv.iter().cloned());
    Ok(argv)
}

fn valid_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

pub fn parse_pid(host: &str, d: &Detached, out: &CommandOutput) -> Result<u32, RemoteError> {
    parse_started(host, d, out).map(|(pid, _)| pid)
}

/// The pid a start printed, and the process's `/proc` stat line where it was still there to read.
pub fn parse_started(
    host: &str,
    d: &Detached,
    out: &CommandOutput,
) -> Result<(u32, Option<String>), RemoteError> {
    let failed = |why: &str| RemoteError::Command {
        host: host.to_string(),
        command: format!(
            "setsid -f {} (log {}, pidfile {})",
            mask(&d.argv.join(" ")),
            d.log,
            d.pidfile
        ),
        status: why.to_string(),
        stderr: out.stderr_lossy().trim().to_string(),
    };
    if !out.success() {
        return Err(failed(&match out.status {
            Some(code) => format!("exit {code}"),
            None => "killed".to_string(),
        }));
    }
    let text = out.stdout_lossy();
    let (pid, stat) = text.split_once('\n').unwrap_or((&text, ""));
    let pid = pid
        .trim()
        .parse()
        .map_err(|_| failed("no pid in its output"))?;
    let stat = stat.trim();
    Ok((pid, (!stat.is_empty()).then(|| stat.to_string())))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn detached(argv: &[&str], env: &[(&str, &str)]) -> Detached {
        Detached {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
            log: "/run/fleet/a.log".into(),
            pidfile: "/run/fleet/a.pid".into(),
        }
    }

    #[test]
    fn values_travel_as_separate_arguments() {
        let d = detached(&["python", "-m", "x; rm -rf /"], &[("A_B", "$(id)")]);
        let argv = spawn_argv("h", &d).unwrap();
        assert_eq!(
            &argv[3..],
            [
                "fleet-spawn",
                "/run/fleet/a.log",
                "/run/fleet/a.pid",
                "--",
                "A_B=$(id)",
                "python",
                "-m",
                "x; rm -rf /"
            ]
        );
    }

    #[test]
    fn bad_env_names_and_empty_commands_are_refused() {
        assert!(spawn_argv("h", &detached(&["x"], &[("A B", "1")])).is_err());
        assert!(spawn_argv("h", &detached(&["x"], &[("1A", "1")])).is_err());
        assert!(spawn_argv("h", &detached(&[], &[])).is_err());
        assert!(spawn_argv("h", &detached(&["A=1"], &[])).is_err());
    }

    /// A real start on this machine: the pid and, in the same command, the stat line of that
    /// very process (its own pid first), which is how its record tells it from a later one.
    #[tokio::test]
    async fn a_start_prints_the_pid_and_that_process_stat_line() {
        use crate::remote::{LocalTransport, Transport};
        let dir = tempfile::tempdir().unwrap();
        let d = Detached {
            log: dir.path().join("a.log").display().to_string(),
            pidfile: dir.path().join("a.pid").display().to_string(),
            ..detached(&["sleep", "30"], &[])
        };
        let t = LocalTransport::new("here");
        let out = t.run(&spawn_argv("here", &d).unwrap()).await.unwrap();
        let (pid, stat) = parse_started("here", &d, &out).unwrap();
        let _ = std::process::Command::new("kill")
            .args(["-KILL", "--", &format!("-{pid}")])
            .status();
        let stat = stat.unwrap_or_else(|| panic!("no stat line in {out:?}"));
        assert!(stat.starts_with(&format!("{pid} (")), "{stat}");
        assert_eq!(
            std::fs::read_to_string(&d.pidfile).unwrap().trim(),
            pid.to_string()
        );
    }

    #[test]
    fn pid_comes_from_stdout_and_failures_carry_stderr() {
        let d = detached(&["x"], &[]);
        let ok = CommandOutput {
            status: Some(0),
            stdout: b"4242\n".to_vec(),
            stderr: vec![],
        };
        assert_eq!(parse_pid("h", &d, &ok).unwrap(), 4242);
        let bad = CommandOutput {
            status: Some(1),
            stdout: vec![],
            stderr: b"setsid: nope".to_vec(),
        };
        let err = parse_pid("h", &d, &bad).unwrap_err().to_string();
        assert!(
            err.contains("setsid: nope") && err.contains("exit 1"),
            "{err}"
        );
    }
}
