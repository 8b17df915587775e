//! Where the test world's installs live (`FLEET_TEST_CACHE`, default `~/.cache/fleet-test`), and
//! the SGLang gateway `scripts/smg-env` installed there. Stands alone, so benches include it too.

use std::path::PathBuf;

/// The cache the test scripts install big things into, once.
pub fn test_cache() -> PathBuf {
    std::env::var_os("FLEET_TEST_CACHE").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/fleet-test"),
        PathBuf::from,
    )
}

/// The gateway's binary; fails (never skips) when it is not installed.
pub fn smg() -> PathBuf {
    let smg = test_cache().join("smg-1.13.0/bin/smg");
    assert!(
        smg.exists(),
        "{} is missing: run scripts/smg-env (scripts/test does)",
        smg.display()
    );
    smg
}
