//! The launcher's `--help` kept between runs, through the real binary: read once, taken from
//! the cache while the launcher, its environment and its version stay, read again when the
//! launcher changes.

mod common;
#[allow(dead_code)]
mod launch_common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::local_fleet::SIM;
use launch_common::Fleet;

/// A launcher of the test's own, so that it can change: a script that runs the sim.
fn write_launcher(path: &Path, note: &str) {
    std::fs::write(path, format!("#!/bin/sh\n# {note}\nexec {SIM} \"$@\"\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn cached(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|e| e == "help"));
    files.sort();
    files
}

#[test]
fn help_is_read_once_then_cached_until_the_launcher_changes() {
    let f = Fleet::new();
    let launcher = f.path().join("launch-sglang");
    write_launcher(&launcher, "first");
    f.write_profile(
        "c",
        &format!(
            "model: /models/test\nlauncher: [{}]\nport_base: {}\nserver:\n  \
             mem_fraction_static: 0.85\nenv:\n  SGLANG_SIM_GPU_STATE_DIR: \"{}\"\n",
            launcher.display(),
            f.port_base,
            f.gpu_state().display()
        ),
    );
    let dry_run = || {
        let out = f
            .fleet()
            .args(["-v", "up", "--profile", "c", "--dry-run"])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let cache = f.path().join("run.preflight");

    let (code, stderr) = dry_run();
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("(read)"), "{stderr}");
    let files = cached(&cache);
    assert_eq!(files.len(), 1, "one cached --help in {}", cache.display());
    assert!(
        !f.run_dir().exists(),
        "the cache is beside the run root, not in it"
    );

    let (code, stderr) = dry_run();
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("(cached)"), "{stderr}");

    // What the cache holds is what preflight checks against: a --help without the profile's
    // flag refuses it.
    std::fs::write(
        &files[0],
        "usage: launch_server [-h]\n\noptions:\n  --model-path MODEL_PATH\n  --port PORT\n  \
         --host HOST\n",
    )
    .unwrap();
    let (code, stderr) = dry_run();
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("unrecognized argument --mem-fraction-static"),
        "{stderr}"
    );

    // Another launcher is another key: its --help is read again, and accepts the flag.
    write_launcher(&launcher, "second, edited");
    let (code, stderr) = dry_run();
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("(read)"), "{stderr}");
    assert_eq!(cached(&cache).len(), 2);
}
