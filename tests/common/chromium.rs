//! Debian's `chromium`, headless, for tests of fleet's pages: no network (every host
//! unresolvable), no background traffic, a fresh profile each time.

use std::path::Path;
use std::process::Command;

/// Runs headless Chromium with `args` and the profile in `profile`.
pub fn chromium(profile: &Path, args: &[&str]) -> std::process::Output {
    Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--disable-default-apps",
            "--host-resolver-rules=MAP * ~NOTFOUND",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .output()
        .expect("Debian's chromium is installed (scripts/test installs it)")
}

/// The DOM Chromium builds from the page `html` (a file), failing the test on a script error.
pub fn rendered_dom(profile: &Path, html: &Path) -> String {
    let url = format!("file://{}", html.display());
    let o = chromium(profile, &["--dump-dom", &url]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "chromium: {stderr}");
    assert!(!stderr.contains("Uncaught"), "a script error: {stderr}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}
