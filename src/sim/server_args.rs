//! What SGLang's `ServerArgs` does after argparse and before any weights load, for the mamba
//! settings the sim models: resolving `auto`, and refusing a no_buffer that the emulated
//! version cannot run. Pure: the caller prints the warnings and the refusal's traceback.

use crate::sim::model::Strategy;

/// The mamba-related values as given on the command line.
#[derive(Debug, Clone, PartialEq)]
pub struct Given<'a> {
    /// `--mamba-radix-cache-strategy` (or the old `--mamba-scheduler-strategy`); `None`: auto.
    pub strategy: Option<Strategy>,
    pub disable_overlap_schedule: bool,
    pub disable_radix_cache: bool,
    pub page_size: Option<u64>,
    pub attention_backend: Option<&'a str>,
}

/// The settings SGLang runs with, and what it logged on the way.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    pub strategy: Strategy,
    pub overlap_disabled: bool,
    pub radix_cache_disabled: bool,
    pub warnings: Vec<&'static str>,
}

/// A start-up refusal: SGLang raises before loading, prints a traceback and exits 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The source file of the check, inside the `sglang` package.
    pub file: &'static str,
    pub function: &'static str,
    pub line: u32,
    /// The source line the traceback shows.
    pub code: &'static str,
    /// `AssertionError: ...` or `ValueError: ...`.
    pub error: String,
}

impl Refusal {
    /// The traceback as Python prints it on stderr.
    pub fn traceback(&self) -> String {
        format!(
            "Traceback (most recent call last):\n  \
             File \"<frozen runpy>\", line 198, in _run_module_as_main\n  \
             File \"<frozen runpy>\", line 88, in _run_code\n  \
             File \"{SITE}/sglang/launch_server.py\", line 84, in <module>\n    \
             run_server(server_args)\n  \
             File \"{SITE}/sglang/launch_server.py\", line 29, in run_server\n    \
             server_args.resolve_once()\n  \
             [...]\n  \
             File \"{SITE}/sglang/{}\", line {}, in {}\n    \
             {}\n{}\n",
            self.file, self.line, self.function, self.code, self.error
        )
    }
}

const SITE: &str = "/usr/local/lib/python3.12/site-packages";

/// From 0.5.15, no_buffer is validated strictly and `auto` may pick extra_buffer.
const STRICT_FROM: (u32, u32, u32) = (0, 5, 15);

/// Resolves the mamba strategy of the simulated hybrid model (a Qwen3.5-style architecture that
/// supports the extra buffer) as `version` of SGLang does.
pub fn resolve(version: (u32, u32, u32), g: &Given<'_>) -> Result<Resolved, Refusal> {
    if version < STRICT_FROM {
        return Ok(resolve_0_5_10(g));
    }
    let mut r = Resolved {
        strategy: Strategy::NoBuffer,
        overlap_disabled: g.disable_overlap_schedule,
        radix_cache_disabled: g.disable_radix_cache,
        warnings: Vec::new(),
    };
    // srt/arg_groups/overrides.py, _mamba_radix_cache_resolution: with the radix cache off the
    // strategy is moot and nothing is resolved or validated.
    if g.disable_radix_cache {
        r.strategy = g.strategy.unwrap_or(Strategy::NoBuffer);
        return Ok(r);
    }
    match g.strategy {
        // srt/arg_groups/overrides.py, _mamba_radix_cache_resolution: `auto` picks extra_buffer
        // when overlap is on (or pages are wanted) and the architecture supports it; otherwise
        // no_buffer, turning overlap off itself.
        None => {
            let wants_paging = g.page_size.is_some_and(|p| p > 1);
            if !g.disable_overlap_schedule || wants_paging {
                r.strategy = Strategy::ExtraBuffer;
            } else {
                r.overlap_disabled = true;
            }
            Ok(r)
        }
        Some(Strategy::NoBuffer) => {
            validate_no_buffer(g)?;
            Ok(r)
        }
        Some(s) => {
            r.strategy = s;
            Ok(r)
        }
    }
}

/// srt/arg_groups/mamba_hook.py, validate_mamba_no_buffer (0.5.23; 0.5.15 has the same asserts
/// in srt/server_args.py): three asserts, checked in this order.
fn validate_no_buffer(g: &Given<'_>) -> Result<(), Refusal> {
    let refusal = |line, code, message: &str| Refusal {
        file: "srt/arg_groups/mamba_hook.py",
        function: "validate_mamba_no_buffer",
        line,
        code,
        error: format!("AssertionError: {message}"),
    };
    if g.page_size.is_some_and(|p| p != 1) {
        return Err(refusal(
            157,
            "assert view.page_size in (1, None), \"no_buffer only supports page_size=1.\"",
            "no_buffer only supports page_size=1.",
        ));
    }
    if !g.disable_overlap_schedule {
        return Err(refusal(
            158,
            "assert view.disable_overlap_schedule, (",
            "no_buffer do not support overlap schedule. Try to set disable_overlap_schedule=True.",
        ));
    }
    if g.attention_backend == Some("trtllm_mha") {
        return Err(refusal(
            161,
            "assert view.attention_backend != \"trtllm_mha\", (",
            "no_buffer do not support trtllm_mha attention backend.",
        ));
    }
    Ok(())
}

/// srt/server_args.py of 0.5.10: `auto` is no_buffer, and no_buffer turns overlap off itself
/// with a warning; trtllm_mha then turns the radix cache off instead.
fn resolve_0_5_10(g: &Given<'_>) -> Resolved {
    let mut r = Resolved {
        strategy: g.strategy.unwrap_or(Strategy::NoBuffer),
        overlap_disabled: g.disable_overlap_schedule,
        radix_cache_disabled: g.disable_radix_cache,
        warnings: Vec::new(),
    };
    if r.strategy == Strategy::NoBuffer && !r.radix_cache_disabled {
        r.warnings.push(
            "Disabling overlap schedule since mamba no_buffer is not compatible with overlap \
             schedule, try to use --disable-radix-cache if overlap schedule is necessary",
        );
        r.overlap_disabled = true;
        if g.attention_backend == Some("trtllm_mha") {
            r.warnings.push(
                "Disabling radix cache since trtllm_mha does not support page_size = 1, which is \
                 required by MambaRadixCache. Try to use --attention-backend triton if radix cache \
                 is necessary.",
            );
            r.radix_cache_disabled = true;
            r.overlap_disabled = false;
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEW: (u32, u32, u32) = (0, 5, 23);
    const OLD: (u32, u32, u32) = (0, 5, 10);

    fn given(strategy: Option<Strategy>, overlap_off: bool) -> Given<'static> {
        Given {
            strategy,
            disable_overlap_schedule: overlap_off,
            disable_radix_cache: false,
            page_size: None,
            attention_backend: None,
        }
    }

    #[test]
    fn no_buffer_without_overlap_off_is_refused_from_0_5_15() {
        let refusal = resolve(NEW, &given(Some(Strategy::NoBuffer), false)).unwrap_err();
        assert_eq!(
            refusal.error,
            "AssertionError: no_buffer do not support overlap schedule. Try to set disable_overlap_schedule=True."
        );
        assert!(refusal.traceback().contains("in validate_mamba_no_buffer"));
        assert!(resolve((0, 5, 15), &given(Some(Strategy::NoBuffer), false)).is_err());
        let ok = resolve(NEW, &given(Some(Strategy::NoBuffer), true)).unwrap();
        assert_eq!(
            (ok.strategy, ok.overlap_disabled),
            (Strategy::NoBuffer, true)
        );
    }

    #[test]
    fn page_size_is_checked_first_then_the_backend() {
        let mut g = given(Some(Strategy::NoBuffer), false);
        g.page_size = Some(16);
        assert_eq!(
            resolve(NEW, &g).unwrap_err().error,
            "AssertionError: no_buffer only supports page_size=1."
        );
        g.page_size = Some(1);
        g.disable_overlap_schedule = true;
        g.attention_backend = Some("trtllm_mha");
        assert_eq!(
            resolve(NEW, &g).unwrap_err().error,
            "AssertionError: no_buffer do not support trtllm_mha attention backend."
        );
        g.disable_radix_cache = true;
        assert!(
            resolve(NEW, &g).is_ok(),
            "without the radix cache nothing is validated"
        );
    }

    #[test]
    fn auto_is_extra_buffer_while_overlap_is_on() {
        let r = resolve(NEW, &given(None, false)).unwrap();
        assert_eq!(
            (r.strategy, r.overlap_disabled),
            (Strategy::ExtraBuffer, false)
        );
        let r = resolve(NEW, &given(None, true)).unwrap();
        assert_eq!((r.strategy, r.overlap_disabled), (Strategy::NoBuffer, true));
        let mut paged = given(None, true);
        paged.page_size = Some(64);
        assert_eq!(
            resolve(NEW, &paged).unwrap().strategy,
            Strategy::ExtraBuffer
        );
    }

    #[test]
    fn old_versions_turn_overlap_off_with_a_warning() {
        let r = resolve(OLD, &given(Some(Strategy::NoBuffer), false)).unwrap();
        assert!(r.overlap_disabled);
        assert_eq!(r.warnings.len(), 1);
        let r = resolve(OLD, &given(None, false)).unwrap();
        assert_eq!(r.strategy, Strategy::NoBuffer);
        let mut trt = given(Some(Strategy::NoBuffer), false);
        trt.attention_backend = Some("trtllm_mha");
        let r = resolve(OLD, &trt).unwrap();
        assert!(r.radix_cache_disabled && !r.overlap_disabled);
        let r = resolve(OLD, &given(Some(Strategy::ExtraBuffer), false)).unwrap();
        assert!(r.warnings.is_empty() && !r.overlap_disabled);
    }
}
