//! Parsing `<launcher> --help` (Python argparse output) into the set of options the installed
//! SGLang accepts: names, aliases, arity and choices.

use std::collections::BTreeMap;

/// How many values an option takes (argparse `nargs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arity {
    /// `store_true`-style: no value.
    Flag,
    /// Exactly one value.
    One,
    /// `nargs='?'`: zero or one.
    Optional,
    /// `nargs='*'`.
    ZeroOrMore,
    /// `nargs='+'`.
    OneOrMore,
}

/// One option entry of `--help`, shared by all its aliases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionSpec {
    /// Every alias, in the order `--help` lists them; the first is the canonical name.
    pub names: Vec<String>,
    pub arity: Arity,
    /// Allowed values, when argparse lists `{a,b,c}`.
    pub choices: Option<Vec<String>>,
}

/// What a launcher's `--help` says it accepts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HelpSpec {
    options: Vec<OptionSpec>,
    /// Alias → index into `options`.
    by_name: BTreeMap<String, usize>,
}

impl HelpSpec {
    /// Reads argparse `--help` text. Only lines that start with two spaces and then `-` are
    /// option entries: the `usage:` block, wrapped descriptions and section titles never are.
    pub fn parse(text: &str) -> HelpSpec {
        let mut spec = HelpSpec::default();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("  ") else {
                continue;
            };
            if !rest.starts_with('-') {
                continue;
            }
            // The description, when on the same line, follows after at least two spaces; no
            // option name, metavar or choice list contains two spaces in a row.
            let head = rest.split("  ").next().unwrap_or(rest);
            if let Some(option) = parse_entry(head) {
                spec.insert(option);
            }
        }
        spec
    }

    fn insert(&mut self, option: OptionSpec) {
        let index = self.options.len();
        for name in &option.names {
            self.by_name.entry(name.clone()).or_insert(index);
        }
        self.options.push(option);
    }

    /// The option an alias belongs to.
    pub fn get(&self, name: &str) -> Option<&OptionSpec> {
        self.by_name.get(name).map(|&i| &self.options[i])
    }

    pub fn has(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    pub fn is_empty(&self) -> bool {
        self.options.is_empty()
    }

    /// Every accepted option name, aliases included.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }

    /// The accepted name closest to `name`, when one is close enough to be a likely typo.
    pub fn nearest(&self, name: &str) -> Option<&str> {
        let (best, score) = self
            .names()
            .map(|candidate| (candidate, strsim::jaro_winkler(name, candidate)))
            .max_by(|a, b| a.1.total_cmp(&b.1))?;
        (score >= 0.85).then_some(best)
    }
}

/// The SGLang version a `--help` text states, if any. Real SGLang does not say it; sglang-sim
/// does ("emulating SGLang 0.5.10"), so a sim host needs no Python to tell its version.
pub fn stated_version(text: &str) -> Option<String> {
    const MARK: &str = "emulating SGLang";
    let at = text.find(MARK)? + MARK.len();
    let version: String = text[at..]
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+'))
        .collect();
    let version = version.trim_end_matches('.');
    (!version.is_empty()).then(|| version.to_string())
}

/// One entry's option part, e.g. `--ep-size EP_SIZE, --expert-parallel-size EP_SIZE`.
fn parse_entry(head: &str) -> Option<OptionSpec> {
    let mut names = Vec::new();
    let mut metavar = "";
    for alias in head.split(", ") {
        let alias = alias.trim();
        let (name, value) = match alias.split_once(' ') {
            Some((name, value)) => (name, value.trim()),
            None => (alias, ""),
        };
        if !name.starts_with('-') {
            return None;
        }
        names.push(name.to_string());
        // Python ≤ 3.12 repeats the metavar after every alias; 3.13+ prints it once, after the
        // last one (`--model-path, --model MODEL_PATH`). The entry as a whole has one arity.
        if !value.is_empty() {
            metavar = value;
        }
    }
    Some(OptionSpec {
        names,
        arity: arity_of(metavar),
        choices: choices_of(metavar),
    })
}

/// argparse renders nargs as `X`, `[X]`, `[X ...]` and `X [X ...]`; a choice list replaces `X`.
fn arity_of(value: &str) -> Arity {
    if value.is_empty() {
        Arity::Flag
    } else if value.starts_with('[') {
        if value.ends_with(" ...]") {
            Arity::ZeroOrMore
        } else {
            Arity::Optional
        }
    } else if value.ends_with(" ...]") {
        Arity::OneOrMore
    } else {
        Arity::One
    }
}

fn choices_of(value: &str) -> Option<Vec<String>> {
    let start = value.find('{')?;
    let end = start + value[start..].find('}')?;
    Some(
        value[start + 1..end]
            .split(',')
            .map(str::to_string)
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const HELP_0_5_23: &str = include_str!("../../tests/fixtures/sglang/help-0.5.23.txt");
    const HELP_0_5_10: &str = include_str!("../../tests/fixtures/sglang/help-0.5.10.txt");
    /// The 0.5.23 table rendered by Python 3.13's argparse (metavar once per entry).
    const HELP_0_5_23_PY313: &str =
        include_str!("../../tests/fixtures/sglang/help-0.5.23-py3.13.txt");

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn reads_every_option_of_real_sglang_tables() {
        // One entry per row of the option tables (531 and 354 rows), plus `-h`.
        assert_eq!(HelpSpec::parse(HELP_0_5_23).options.len(), 532);
        assert_eq!(HelpSpec::parse(HELP_0_5_10).options.len(), 355);
    }

    #[test]
    fn aliases_share_one_entry() {
        let spec = HelpSpec::parse(HELP_0_5_23);
        let model = spec.get("--model").unwrap();
        assert_eq!(model.names, strings(&["--model-path", "--model"]));
        assert_eq!(model.arity, Arity::One);
        assert_eq!(spec.get("--model-path"), Some(model));
        let ep = spec.get("--ep").unwrap();
        assert_eq!(
            ep.names,
            strings(&["--ep-size", "--expert-parallel-size", "--ep"])
        );
        let help = spec.get("-h").unwrap();
        assert_eq!(help.names, strings(&["-h", "--help"]));
        assert_eq!(help.arity, Arity::Flag);
    }

    #[test]
    fn choices_and_arity_by_version() {
        let new = HelpSpec::parse(HELP_0_5_23);
        let strategy = new.get("--mamba-radix-cache-strategy").unwrap();
        assert_eq!(strategy.arity, Arity::One);
        assert_eq!(
            strategy.choices,
            Some(strings(&[
                "auto",
                "no_buffer",
                "extra_buffer",
                "extra_buffer_lazy"
            ]))
        );
        assert!(!new.has("--mamba-scheduler-strategy"));
        let old = HelpSpec::parse(HELP_0_5_10);
        assert!(!old.has("--mamba-radix-cache-strategy"));
        assert_eq!(
            old.get("--mamba-scheduler-strategy").unwrap().choices,
            Some(strings(&["auto", "no_buffer", "extra_buffer"]))
        );
        assert_eq!(new.get("--trust-remote-code").unwrap().arity, Arity::Flag);
        assert_eq!(new.get("--numa-node").unwrap().arity, Arity::OneOrMore);
        assert_eq!(new.get("--lora-paths").unwrap().arity, Arity::ZeroOrMore);
        assert_eq!(new.get("--model-checksum").unwrap().arity, Arity::Optional);
        let modules = new.get("--lora-target-modules").unwrap();
        assert_eq!(modules.arity, Arity::ZeroOrMore);
        assert_eq!(
            modules
                .choices
                .as_ref()
                .unwrap()
                .first()
                .map(String::as_str),
            Some("q_proj")
        );
        // A choice list far wider than 80 columns stays on its line and is read whole.
        let a2a = new
            .get("--moe-a2a-backend")
            .unwrap()
            .choices
            .clone()
            .unwrap();
        assert_eq!(a2a.last().map(String::as_str), Some("flashinfer_megamoe"));
        assert_eq!(
            new.get("--no-enable-tf32-matmul").unwrap().arity,
            Arity::Flag
        );
    }

    #[test]
    fn python_3_13_help_reads_the_same_options() {
        let old = HelpSpec::parse(HELP_0_5_23);
        let new = HelpSpec::parse(HELP_0_5_23_PY313);
        assert!(HELP_0_5_23_PY313.contains("\n  --model-path, --model MODEL_PATH\n"));
        assert_eq!(new, old, "both layouts describe the same options");
        assert_eq!(new.get("--model").unwrap().arity, Arity::One);
        let ep = new.get("--ep").unwrap();
        assert_eq!((ep.arity, ep.names.len()), (Arity::One, 3));
    }

    #[test]
    fn usage_block_and_descriptions_are_not_options() {
        let text = "usage: x [-h] [--alpha ALPHA]\n                [--beta {a,b}]\n\noptions:\n  -h, --help            show this help message and exit\n  --alpha ALPHA         the alpha; see\n                        --not-an-option here\n  --a-very-long-option-name A_VERY_LONG_OPTION_NAME\n                        text\n";
        let spec = HelpSpec::parse(text);
        assert_eq!(
            spec.names().collect::<Vec<_>>(),
            vec!["--a-very-long-option-name", "--alpha", "--help", "-h"]
        );
        assert_eq!(spec.get("--alpha").unwrap().arity, Arity::One);
    }

    #[test]
    fn nearest_suggests_only_likely_typos() {
        let spec = HelpSpec::parse(HELP_0_5_23);
        assert_eq!(
            spec.nearest("--mem-fraction-statc"),
            Some("--mem-fraction-static")
        );
        assert_eq!(spec.nearest("--trust-remote"), Some("--trust-remote-code"));
        assert_eq!(spec.nearest("--zzzzzz-qqqq"), None);
    }

    #[test]
    fn version_stated_by_the_simulator() {
        assert_eq!(
            stated_version("usage: sglang-sim [-h]\n\nsglang-sim: emulating SGLang 0.5.10.\n"),
            Some("0.5.10".to_string())
        );
        assert_eq!(
            stated_version("sglang-sim emulating SGLang\n0.5.23: a stand-in"),
            Some("0.5.23".to_string())
        );
        assert_eq!(stated_version(HELP_0_5_23), None);
    }
}
