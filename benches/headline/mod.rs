//! What the whole-run benchmarks share: the `--quick` switch and the one machine-readable line
//! per headline result that `scripts/bench` gathers into its table and the README's.

/// Short runs (`cargo bench --bench NAME -- --quick`): a smoke test of the benchmark, whose
/// numbers are not the targets' measurements. The same flag puts criterion in its quick mode.
pub fn quick() -> bool {
    std::env::args().any(|a| a == "--quick")
}

/// Prints `BENCH<TAB>key<TAB>measured<TAB>target<TAB>pass|fail|info`. `met` is `None` for a
/// number shown next to a target without being held to it.
pub fn line(key: &str, measured: &str, target: &str, met: Option<bool>) {
    let verdict = match met {
        Some(true) => "pass",
        Some(false) => "fail",
        None => "info",
    };
    for field in [key, measured, target] {
        assert!(
            !field.contains(['\t', '\n']),
            "a BENCH field holds a tab or newline: {field:?}"
        );
    }
    println!("BENCH\t{key}\t{measured}\t{target}\t{verdict}");
}
