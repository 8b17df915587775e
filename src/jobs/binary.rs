//! Which `fleet` runs a job on its target: the host's own when it is this version, else this
//! very executable uploaded into the job directory when the host's OS and CPU match, else none
//! (with what was found, and how to install one). The client's files are never assumed visible
//! on the target.

use super::{JobError, transfer};
use crate::launch::state::run_ok;
use crate::remote::{Transport, argv};

/// `fleet --version` of this build.
pub fn our_version() -> String {
    format!("fleet {}", env!("CARGO_PKG_VERSION"))
}

/// `uname -sm` of the machine this build runs on.
fn our_platform() -> String {
    let os = match std::env::consts::OS {
        "linux" => "Linux",
        "macos" => "Darwin",
        other => other,
    };
    format!("{os} {}", std::env::consts::ARCH)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BinaryChoice {
    /// `fleet` on the target's PATH is this version.
    OnPath,
    /// Send this executable: the target's OS and CPU are ours.
    Upload,
    /// Nothing can run there; `found` is the target's `uname -sm`.
    Refuse { found: String },
}

/// Decides from what the target said: `version` (its `fleet --version`, if any) and `platform`
/// (its `uname -sm`).
pub fn choose(
    version: Option<&str>,
    platform: &str,
    ours_version: &str,
    ours_platform: &str,
) -> BinaryChoice {
    if version.map(str::trim) == Some(ours_version) {
        return BinaryChoice::OnPath;
    }
    let normal = |p: &str| {
        p.split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .to_lowercase()
    };
    if normal(platform) == normal(ours_platform) {
        BinaryChoice::Upload
    } else {
        BinaryChoice::Refuse {
            found: platform.trim().to_string(),
        }
    }
}

/// The `fleet` a job in `job_dir` runs on `t`: `fleet` (on PATH) or `job_dir/fleet`, uploaded
/// and checked to run.
pub async fn fleet_on(t: &dyn Transport, job_dir: &str) -> Result<String, JobError> {
    let probe = r#"command -v fleet >/dev/null 2>&1 && fleet --version 2>/dev/null; true"#;
    let found = t.run(&argv(&["sh", "-c", probe])).await?.stdout_lossy();
    let found = found.lines().next().filter(|l| !l.trim().is_empty());
    let platform = run_ok(t, &argv(&["uname", "-sm"])).await?;
    let ours = our_version();
    match choose(found, &platform, &ours, &our_platform()) {
        BinaryChoice::OnPath => Ok("fleet".to_string()),
        BinaryChoice::Refuse { found } => Err(JobError::Binary {
            host: t.host().to_string(),
            found,
            ours: format!("{ours} for {}", our_platform()),
        }),
        BinaryChoice::Upload => {
            let exe = std::env::current_exe().map_err(|source| JobError::Local {
                path: "the running fleet".into(),
                source,
            })?;
            let remote = format!("{job_dir}/fleet");
            let sent = transfer::upload(t, &exe, &remote).await?;
            tracing::debug!(
                "{}: uploaded {} ({} bytes, {} on the wire)",
                t.host(),
                exe.display(),
                sent.bytes,
                sent.on_wire
            );
            run_ok(t, &argv(&["chmod", "0755", "--", &remote])).await?;
            let out = t.run(&argv(&[&remote, "--version"])).await?;
            let said = out.stdout_lossy();
            if out.success() && said.trim() == ours {
                Ok(remote)
            } else {
                Err(JobError::BinaryBroken {
                    host: t.host().to_string(),
                    detail: format!(
                        "`{remote} --version` said {:?} (exit {:?}): {}",
                        said.trim(),
                        out.status,
                        out.stderr_lossy().trim()
                    ),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hosts_own_fleet_if_it_is_ours_else_an_upload_if_it_can_run_else_a_refusal() {
        let (v, p) = ("fleet 0.1.0", "Linux x86_64");
        assert_eq!(
            choose(Some("fleet 0.1.0\n"), "Linux x86_64", v, p),
            BinaryChoice::OnPath
        );
        assert_eq!(
            choose(Some("fleet 0.0.9"), "Linux x86_64\n", v, p),
            BinaryChoice::Upload
        );
        assert_eq!(choose(None, "linux  x86_64", v, p), BinaryChoice::Upload);
        assert_eq!(
            choose(None, "Linux aarch64", v, p),
            BinaryChoice::Refuse {
                found: "Linux aarch64".into()
            }
        );
        assert_eq!(
            our_version(),
            format!("fleet {}", env!("CARGO_PKG_VERSION"))
        );
    }
}
