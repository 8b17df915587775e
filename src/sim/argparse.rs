//! A faithful emulation of the Python argparse parser behind `python -m sglang.launch_server`:
//! option tables per SGLang version, abbreviation matching, argparse's error texts and `--help`.

use std::collections::HashMap;

/// The program name SGLang's argparse errors carry.
pub const PROG: &str = "sglang.launch_server";

const TABLE_0_5_23: &str = include_str!("data/launch_server-flags-0.5.23.tsv");
const TABLE_0_5_10: &str = include_str!("data/launch_server-flags-0.5.10.tsv");

/// How many values an option consumes (argparse's `nargs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nargs {
    /// A flag (store_true / store_false / BooleanOptionalAction).
    Zero,
    /// Exactly one value (argparse's default).
    One,
    /// `?`: zero or one value.
    Optional,
    /// `*`: any number of values.
    Any,
    /// `+`: at least one value.
    AtLeastOne,
}

/// The value type argparse converts an option's string to, for the options the sim models.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Str,
    Int,
    Float,
}

/// One option of the parser.
#[derive(Debug, Clone)]
pub struct OptSpec {
    /// Option strings, primary first (`--model-path`, `--model`).
    pub names: Vec<String>,
    pub nargs: Nargs,
    pub choices: Vec<String>,
    /// The default as Python's repr (`None`, `False`, `8`, `lru`).
    pub default: String,
    pub kind: Kind,
    pub required: bool,
    pub help: String,
}

impl OptSpec {
    /// argparse's `dest`: the first long option string without dashes, `-` as `_`.
    pub fn dest(&self) -> String {
        self.names[0].trim_start_matches('-').replace('-', "_")
    }

    /// The name argparse uses in errors: all option strings joined with `/`.
    fn display(&self) -> String {
        self.names.join("/")
    }

    fn metavar(&self) -> String {
        if self.choices.is_empty() {
            self.dest().to_uppercase()
        } else {
            format!("{{{}}}", self.choices.join(","))
        }
    }

    /// The `--no-x` alias of a BooleanOptionalAction, if this option has one.
    fn negation(&self) -> Option<&str> {
        let negated = format!("--no-{}", self.names[0].trim_start_matches("--"));
        self.names
            .iter()
            .find(|n| **n == negated)
            .map(String::as_str)
    }

    fn value_part(&self) -> String {
        let m = self.metavar();
        match self.nargs {
            Nargs::Zero => String::new(),
            Nargs::One => format!(" {m}"),
            Nargs::Optional => format!(" [{m}]"),
            Nargs::Any => format!(" [{m} ...]"),
            Nargs::AtLeastOne => format!(" {m} [{m} ...]"),
        }
    }

    fn usage_part(&self) -> String {
        let body = match self.negation() {
            Some(neg) => format!("{} | {neg}", self.names[0]),
            None => format!("{}{}", self.names[0], self.value_part()),
        };
        if self.required {
            body
        } else {
            format!("[{body}]")
        }
    }

    fn invocation(&self, metavar_once: bool) -> String {
        if self.nargs == Nargs::Zero {
            return self.names.join(", ");
        }
        let v = self.value_part();
        if metavar_once {
            return format!("{}{v}", self.names.join(", "));
        }
        self.names
            .iter()
            .map(|n| format!("{n}{v}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A parsed option value, stored under the option's dest.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Bool(bool),
    One(String),
    Many(Vec<String>),
    /// `nargs='?'` given without a value (argparse stores `const`, which is None here).
    Missing,
}

/// What the parser produced: the options given on the command line, by dest.
#[derive(Debug, Default, PartialEq)]
pub struct Parsed {
    pub given: HashMap<String, Value>,
}

impl Parsed {
    pub fn str(&self, dest: &str) -> Option<&str> {
        match self.given.get(dest) {
            Some(Value::One(s)) => Some(s),
            _ => None,
        }
    }

    pub fn flag(&self, dest: &str) -> bool {
        matches!(self.given.get(dest), Some(Value::Bool(true)))
    }
}

/// Why parsing stopped: help was asked for (exit 0) or the command line is wrong (exit 2).
#[derive(Debug, PartialEq)]
pub enum Outcome {
    Help(String),
    Error(String),
}

enum Found<'a> {
    Opt(&'a OptSpec, String),
    Help,
    Unknown,
}

/// An argparse-like parser over a fixed option table.
#[derive(Debug)]
pub struct Parser {
    pub description: String,
    /// Python 3.13+ argparse: an entry's metavar is printed once, after its last alias.
    pub metavar_once: bool,
    /// (group title, options); the first group is argparse's default `options:`.
    pub groups: Vec<(String, Vec<OptSpec>)>,
}

/// Which SGLang option table a sim version uses, and whether the deprecated aliases
/// `--mamba-scheduler-strategy` / `--cuda-graph-max-bs` are added to it. 0.5.19's
/// srt/server_args.py still registers both as `DeprecatedAliasStoreAction`; 0.5.20 dropped them.
pub fn table_for(version: (u32, u32, u32)) -> (&'static str, bool) {
    if version < (0, 5, 15) {
        (TABLE_0_5_10, false)
    } else if version <= (0, 5, 19) {
        (TABLE_0_5_23, true)
    } else {
        (TABLE_0_5_23, false)
    }
}

/// Parses `0.5.23` (a trailing suffix such as `.post1` or `rc1` on the patch is ignored).
pub fn parse_version(s: &str) -> Option<(u32, u32, u32)> {
    let mut it = s.split('.');
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    let patch_str = it.next()?;
    let digits: String = patch_str.chars().take_while(char::is_ascii_digit).collect();
    let patch = digits.parse().ok()?;
    Some((major, minor, patch))
}

/// Reads an SGLang option table (TSV: names, takes_value, nargs, choices, default).
pub fn load_table(tsv: &str) -> Vec<OptSpec> {
    tsv.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|line| {
            let cols: Vec<&str> = line.split('\t').collect();
            let col = |i: usize| cols.get(i).copied().unwrap_or("");
            let names: Vec<String> = col(0).split('|').map(str::to_string).collect();
            let nargs = match (col(1), col(2)) {
                ("0", _) => Nargs::Zero,
                (_, "?") => Nargs::Optional,
                (_, "*") => Nargs::Any,
                (_, "+") => Nargs::AtLeastOne,
                _ => Nargs::One,
            };
            let choices = match col(3) {
                "" | "?" => Vec::new(),
                c => c.split('|').map(str::to_string).collect(),
            };
            let default = col(4).to_string();
            let dest = names[0].trim_start_matches('-').replace('-', "_");
            let (kind, help) = match crate::sim::modeled::modeled(&dest) {
                Some((k, h)) => (k, h.to_string()),
                None => (
                    Kind::Str,
                    format!(
                        "Accepted as data; not simulated by sglang-sim. (default: {})",
                        if default == "?" {
                            "computed at start-up"
                        } else {
                            &default
                        }
                    ),
                ),
            };
            OptSpec {
                required: dest == "model_path",
                names,
                nargs,
                choices,
                default,
                kind,
                help,
            }
        })
        .collect()
}

/// The options SGLang 0.5.15..=0.5.19 still accepted under their old names.
pub fn deprecated_aliases() -> Vec<OptSpec> {
    let alias = |name: &str, choices: &[&str], help: &str| OptSpec {
        names: vec![name.to_string()],
        nargs: Nargs::One,
        choices: choices.iter().map(|c| c.to_string()).collect(),
        default: "None".into(),
        kind: if choices.is_empty() {
            Kind::Int
        } else {
            Kind::Str
        },
        required: false,
        help: help.to_string(),
    };
    vec![
        alias(
            "--mamba-scheduler-strategy",
            &["auto", "no_buffer", "extra_buffer"],
            "Deprecated alias of --mamba-radix-cache-strategy.",
        ),
        alias(
            "--cuda-graph-max-bs",
            &[],
            "Deprecated alias of --cuda-graph-max-bs-decode.",
        ),
    ]
}

fn looks_negative_number(s: &str) -> bool {
    let rest = match s.strip_prefix('-') {
        Some(r) => r,
        None => return false,
    };
    let (int, frac) = match rest.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (rest, None),
    };
    let digits = |x: &str| !x.is_empty() && x.bytes().all(|b| b.is_ascii_digit());
    match frac {
        None => digits(int),
        Some(f) => (int.is_empty() || digits(int)) && digits(f),
    }
}

/// argparse's test of whether a command-line word is an option (`O`) rather than a value (`A`).
fn is_option_like(s: &str) -> bool {
    s.starts_with('-') && s != "-" && !looks_negative_number(s) && !s.contains(' ')
}

fn check_value(spec: &OptSpec, v: &str) -> Result<(), String> {
    let bad_type = match spec.kind {
        Kind::Str => None,
        Kind::Int => v.trim().parse::<i64>().err().map(|_| "int"),
        Kind::Float => v.trim().parse::<f64>().err().map(|_| "float"),
    };
    if let Some(t) = bad_type {
        return Err(format!(
            "argument {}: invalid {t} value: '{v}'",
            spec.display()
        ));
    }
    if !spec.choices.is_empty() && !spec.choices.iter().any(|c| c == v) {
        let list = spec
            .choices
            .iter()
            .map(|c| format!("'{c}'"))
            .collect::<Vec<_>>()
            .join(", ");
        return Err(format!(
            "argument {}: invalid choice: '{v}' (choose from {list})",
            spec.display()
        ));
    }
    Ok(())
}

impl Parser {
    fn all(&self) -> impl Iterator<Item = &OptSpec> {
        self.groups.iter().flat_map(|(_, g)| g.iter())
    }

    /// Finds the option a word names: exact match first, then an unambiguous prefix of a long
    /// option (argparse's `allow_abbrev`, which SGLang leaves on).
    fn lookup(&self, word: &str, name: &str) -> Result<Found<'_>, String> {
        if name == "-h" || name == "--help" {
            return Ok(Found::Help);
        }
        for spec in self.all() {
            if let Some(n) = spec.names.iter().find(|n| *n == name) {
                return Ok(Found::Opt(spec, n.clone()));
            }
        }
        if !name.starts_with("--") || name.len() < 3 {
            return Ok(Found::Unknown);
        }
        let mut matches: Vec<(Option<&OptSpec>, &str)> = Vec::new();
        if "--help".starts_with(name) {
            matches.push((None, "--help"));
        }
        matches.extend(
            self.all()
                .flat_map(|s| s.names.iter().map(move |n| (Some(s), n.as_str())))
                .filter(|(_, n)| n.starts_with(name)),
        );
        match matches.as_slice() {
            [] => Ok(Found::Unknown),
            [(None, _)] => Ok(Found::Help),
            [(Some(spec), n)] => Ok(Found::Opt(spec, n.to_string())),
            _ => Err(format!(
                "ambiguous option: {word} could match {}",
                matches
                    .iter()
                    .map(|(_, n)| *n)
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }

    /// Parses a command line (without the program name) like `parser.parse_args()`.
    pub fn parse(&self, args: &[String]) -> Result<Parsed, Outcome> {
        let mut parsed = Parsed::default();
        let mut extras: Vec<String> = Vec::new();
        let mut i = 0;
        let mut only_positionals = false;
        while i < args.len() {
            let word = &args[i];
            i += 1;
            if only_positionals || !is_option_like(word) {
                extras.push(word.clone());
                continue;
            }
            if word == "--" {
                only_positionals = true;
                continue;
            }
            let (name, explicit) = match word.split_once('=') {
                Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
                _ => (word.as_str(), None),
            };
            let (spec, matched) = match self.lookup(word, name).map_err(Outcome::Error)? {
                Found::Opt(spec, matched) => (spec, matched),
                Found::Help => return Err(Outcome::Help(self.help())),
                Found::Unknown => {
                    extras.push(word.clone());
                    continue;
                }
            };
            let dest = spec.dest();
            let err = |m: String| Outcome::Error(format!("argument {}: {m}", spec.display()));
            let value = match spec.nargs {
                Nargs::Zero => {
                    if let Some(v) = explicit {
                        return Err(err(format!("ignored explicit argument '{v}'")));
                    }
                    let on = if spec.negation() == Some(matched.as_str()) {
                        false
                    } else {
                        spec.default != "True" || spec.negation().is_some()
                    };
                    Value::Bool(on)
                }
                Nargs::One => {
                    let v = match explicit {
                        Some(v) => v,
                        None if i < args.len() && !is_option_like(&args[i]) => {
                            i += 1;
                            args[i - 1].clone()
                        }
                        None => return Err(err("expected one argument".into())),
                    };
                    check_value(spec, &v).map_err(Outcome::Error)?;
                    Value::One(v)
                }
                Nargs::Optional => match explicit {
                    Some(v) => {
                        check_value(spec, &v).map_err(Outcome::Error)?;
                        Value::One(v)
                    }
                    None if i < args.len() && !is_option_like(&args[i]) => {
                        i += 1;
                        check_value(spec, &args[i - 1]).map_err(Outcome::Error)?;
                        Value::One(args[i - 1].clone())
                    }
                    None => Value::Missing,
                },
                Nargs::Any | Nargs::AtLeastOne => {
                    let mut vals: Vec<String> = explicit.into_iter().collect();
                    if vals.is_empty() {
                        while i < args.len() && !is_option_like(&args[i]) {
                            vals.push(args[i].clone());
                            i += 1;
                        }
                    }
                    if vals.is_empty() && spec.nargs == Nargs::AtLeastOne {
                        return Err(err("expected at least one argument".into()));
                    }
                    for v in &vals {
                        check_value(spec, v).map_err(Outcome::Error)?;
                    }
                    Value::Many(vals)
                }
            };
            parsed.given.insert(dest, value);
        }
        let missing: Vec<String> = self
            .all()
            .filter(|s| s.required && !parsed.given.contains_key(&s.dest()))
            .map(OptSpec::display)
            .collect();
        if !missing.is_empty() {
            return Err(Outcome::Error(format!(
                "the following arguments are required: {}",
                missing.join(", ")
            )));
        }
        if !extras.is_empty() {
            return Err(Outcome::Error(format!(
                "unrecognized arguments: {}",
                extras.join(" ")
            )));
        }
        Ok(parsed)
    }

    /// The whole error text argparse prints to stderr before exiting with status 2.
    pub fn error_text(&self, message: &str) -> String {
        format!("{}{PROG}: error: {message}\n", self.usage())
    }

    /// The `usage:` block, wrapped like argparse at 78 columns.
    pub fn usage(&self) -> String {
        let prefix = format!("usage: {PROG} ");
        let mut parts = vec!["[-h]".to_string()];
        parts.extend(self.all().map(OptSpec::usage_part));
        let mut out = String::new();
        let mut line = prefix.clone();
        let mut line_has_part = false;
        for part in parts {
            if line_has_part && line.len() + 1 + part.len() > WIDTH {
                out.push_str(line.trim_end());
                out.push('\n');
                line = " ".repeat(prefix.len());
                line_has_part = false;
            }
            if line_has_part {
                line.push(' ');
            }
            line.push_str(&part);
            line_has_part = true;
        }
        out.push_str(&line);
        out.push('\n');
        out
    }

    /// The `--help` text: usage, description, then every option at argparse's columns.
    pub fn help(&self) -> String {
        let mut out = self.usage();
        out.push('\n');
        for l in wrap(&self.description, WIDTH) {
            out.push_str(&l);
            out.push('\n');
        }
        for (n, (title, opts)) in self.groups.iter().enumerate() {
            out.push('\n');
            out.push_str(title);
            out.push_str(":\n");
            if n == 0 {
                push_entry(&mut out, "-h, --help", "show this help message and exit");
            }
            for o in opts {
                push_entry(&mut out, &o.invocation(self.metavar_once), &o.help);
            }
        }
        out
    }
}

/// argparse's default width: 80 columns minus 2.
const WIDTH: usize = 78;
/// The column where option descriptions start.
const HELP_COL: usize = 24;

fn push_entry(out: &mut String, invocation: &str, help: &str) {
    let lines = wrap(help, WIDTH - HELP_COL);
    let header = format!("  {invocation}");
    let mut rest = lines.iter();
    if header.len() + 2 <= HELP_COL {
        out.push_str(&format!("{header:<HELP_COL$}"));
        if let Some(first) = rest.next() {
            out.push_str(first);
        }
        out.push('\n');
    } else {
        out.push_str(&header);
        out.push('\n');
    }
    for l in rest {
        out.push_str(&" ".repeat(HELP_COL));
        out.push_str(l);
        out.push('\n');
    }
}

fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.len() + 1 + word.len() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parser(version: (u32, u32, u32)) -> Parser {
        let (table, aliases) = table_for(version);
        let mut opts = load_table(table);
        if aliases {
            opts.extend(deprecated_aliases());
        }
        Parser {
            description: "test".into(),
            metavar_once: false,
            groups: vec![("options".into(), opts)],
        }
    }

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    fn err(p: &Parser, s: &str) -> String {
        match p.parse(&args(s)) {
            Err(Outcome::Error(e)) => e,
            other => panic!("expected an error for {s:?}, got {other:?}"),
        }
    }

    #[test]
    fn version_selects_the_table_and_aliases() {
        let new = parser((0, 5, 23));
        assert_eq!(
            err(&new, "--model-path /m --mamba-scheduler-strategy no_buffer"),
            "unrecognized arguments: --mamba-scheduler-strategy no_buffer"
        );
        let mid = parser((0, 5, 16));
        assert!(
            mid.parse(&args("--model /m --mamba-scheduler-strategy no_buffer"))
                .is_ok()
        );
        assert!(
            mid.parse(&args(
                "--model /m --mamba-radix-cache-strategy extra_buffer_lazy"
            ))
            .is_ok()
        );
        let old = parser((0, 5, 10));
        assert_eq!(
            err(&old, "--model /m --mamba-radix-cache-strategy no_buffer"),
            "unrecognized arguments: --mamba-radix-cache-strategy no_buffer"
        );
        assert_eq!(
            err(
                &old,
                "--model /m --mamba-scheduler-strategy extra_buffer_lazy"
            ),
            "argument --mamba-scheduler-strategy: invalid choice: 'extra_buffer_lazy' \
             (choose from 'auto', 'no_buffer', 'extra_buffer')"
        );
    }

    #[test]
    fn argparse_errors_match_python() {
        let p = parser((0, 5, 23));
        assert_eq!(
            err(&p, "--model-path /m --mamba-radix-cache-strategy bogus"),
            "argument --mamba-radix-cache-strategy: invalid choice: 'bogus' (choose from \
             'auto', 'no_buffer', 'extra_buffer', 'extra_buffer_lazy')"
        );
        assert_eq!(
            err(&p, "--model-path /m --port"),
            "argument --port: expected one argument"
        );
        assert_eq!(
            err(&p, "--model-path /m --port abc"),
            "argument --port: invalid int value: 'abc'"
        );
        assert_eq!(
            err(&p, "--model-path --port 1"),
            "argument --model-path/--model: expected one argument"
        );
        assert_eq!(
            err(&p, "--port 1"),
            "the following arguments are required: --model-path/--model"
        );
        assert_eq!(
            err(&p, "--model /m --trust-remote-code=yes"),
            "argument --trust-remote-code: ignored explicit argument 'yes'"
        );
        assert_eq!(
            err(&p, "--model /m --bogus 1 stray"),
            "unrecognized arguments: --bogus 1 stray"
        );
        // 0.5.23 has both -decode and -prefill, so the old name is an ambiguous prefix.
        assert_eq!(
            err(&p, "--model /m --cuda-graph-max-bs 8"),
            "ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, \
             --cuda-graph-max-bs-prefill"
        );
    }

    #[test]
    fn values_abbreviations_and_flags() {
        let p = parser((0, 5, 23));
        let got = p
            .parse(&args(
                "--model=/m --mem-fraction-st 0.8 --enable-metrics --numa-node 0 1 \
                 --no-enable-tf32-matmul --port=31000",
            ))
            .unwrap();
        assert_eq!(got.str("model_path"), Some("/m"));
        assert_eq!(got.str("mem_fraction_static"), Some("0.8"));
        assert_eq!(got.str("port"), Some("31000"));
        assert!(got.flag("enable_metrics"));
        assert_eq!(
            got.given["numa_node"],
            Value::Many(vec!["0".into(), "1".into()])
        );
        assert_eq!(got.given["enable_tf32_matmul"], Value::Bool(false));
    }

    #[test]
    fn help_has_the_format_preflight_parsers_rely_on() {
        let p = parser((0, 5, 23));
        let help = p.help();
        assert!(help.starts_with("usage: sglang.launch_server [-h] --model-path MODEL_PATH"));
        assert!(help.contains("\n  --model-path MODEL_PATH, --model MODEL_PATH\n"));
        assert!(help.contains(
            "\n  --mamba-radix-cache-strategy {auto,no_buffer,extra_buffer,extra_buffer_lazy}\n"
        ));
        assert!(help.contains("\n  --port PORT           The port of the HTTP server.\n"));
        assert!(help.contains("\n  -h, --help            show this help message and exit\n"));
        // Lines wrap at the width unless a single part is longer than it.
        assert!(
            p.usage()
                .lines()
                .all(|l| l.len() <= WIDTH || !l.trim().contains("] ["))
        );
        assert_eq!(
            p.parse(&args("--model /m --help")),
            Err(Outcome::Help(help.clone()))
        );
        let py313 = Parser {
            metavar_once: true,
            ..p
        };
        let help = py313.help();
        assert!(help.contains("\n  --model-path, --model MODEL_PATH\n"));
        assert!(help.contains("\n  -h, --help            show this help message and exit\n"));
    }

    #[test]
    fn negative_numbers_are_values() {
        let p = parser((0, 5, 23));
        let got = p
            .parse(&args("--model /m --mamba-max-states-per-path -1"))
            .unwrap();
        assert_eq!(got.str("mamba_max_states_per_path"), Some("-1"));
        assert_eq!(parse_version("0.5.23.post1"), Some((0, 5, 23)));
        assert_eq!(parse_version("0.5.15rc0"), Some((0, 5, 15)));
        assert_eq!(parse_version("x"), None);
    }
}
