//! The manual's promises, checked: every ```` ```console ```` example in README.md and docs/
//! runs through the real `fleet` binary with its output and exit status compared; every
//! relative link and `#anchor` resolves; docs/SUMMARY.md lists every page; every subcommand of
//! `fleet --help` has its page under docs/reference/ naming each of its long flags, and its
//! `--help` points there; every flag's short help is one line; the map of src/ names every
//! top-level module and the environment page every `FLEET_*` variable the code reads.
//! The example format is described in docs/internals/test-worlds.md ("The docs' examples").

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use clap::CommandFactory;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn fleet() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_fleet"))
}

/// README.md and every Markdown file under docs/, sorted, relative to the repository root.
fn markdown_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|x| x == "md") {
                out.push(path);
            }
        }
    }
    let mut files = vec![root().join("README.md")];
    walk(&root().join("docs"), &mut files);
    files.sort();
    files
        .into_iter()
        .map(|p| p.strip_prefix(root()).unwrap().to_path_buf())
        .collect()
}

fn read(rel: &Path) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{}: {e}", rel.display()))
}

/// A line's fence, if it opens or closes one: its backtick count and info string.
fn fence(line: &str) -> Option<(usize, &str)> {
    let t = line.trim_start();
    let n = t.chars().take_while(|&c| c == '`').count();
    (n >= 3).then(|| (n, t[n..].trim()))
}

/// Each line of a Markdown text with whether it is inside a fenced block (fence lines count as
/// inside) and, when inside, the block's info string.
fn lines_with_fences(text: &str) -> Vec<(usize, &str, Option<&str>)> {
    let mut out = Vec::new();
    let mut open: Option<(usize, &str)> = None;
    for (i, line) in text.lines().enumerate() {
        match (open, fence(line)) {
            (None, Some((n, info))) => {
                open = Some((n, info));
                out.push((i + 1, line, Some(info)));
            }
            (Some((n, info)), Some((m, rest))) if m >= n && rest.is_empty() => {
                open = None;
                out.push((i + 1, line, Some(info)));
            }
            (Some((_, info)), _) => out.push((i + 1, line, Some(info))),
            (None, None) => out.push((i + 1, line, None)),
        }
    }
    out
}

// ------------------------------------------------------------------------------------------
// The examples

#[derive(Debug)]
struct Example {
    at: String,
    command: String,
    expected: Vec<String>,
    exit: i32,
}

/// The `console` blocks of a file: each `$ ` line a command, the lines after it its output, a
/// last `[exit N]` its status.
fn examples(rel: &Path) -> Vec<Example> {
    let text = read(rel);
    let mut out: Vec<Example> = Vec::new();
    let mut in_block = false;
    let mut block_start = 0;
    let mut commands_in_block = 0;
    for (n, line, info) in lines_with_fences(&text) {
        let is_console = info == Some("console");
        if is_console && fence(line).is_some() {
            if in_block {
                assert!(
                    commands_in_block > 0,
                    "{}:{block_start}: a console block without a `$ fleet` command",
                    rel.display()
                );
            }
            in_block = !in_block;
            block_start = n;
            commands_in_block = 0;
            continue;
        }
        if !in_block {
            continue;
        }
        let at = format!("{}:{n}", rel.display());
        if let Some(cmd) = line.strip_prefix("$ ") {
            // `NAME=value ... fleet ...`: variables for this one command, then fleet.
            let run = cmd
                .split(' ')
                .skip_while(|w| w.split_once('=').is_some_and(|(k, _)| is_env_name(k)))
                .collect::<Vec<_>>()
                .join(" ");
            assert!(
                run == "fleet" || run.starts_with("fleet "),
                "{at}: a console example runs fleet, not `{cmd}`"
            );
            commands_in_block += 1;
            out.push(Example {
                at,
                command: cmd.to_string(),
                expected: Vec::new(),
                exit: 0,
            });
        } else {
            let ex = out
                .last_mut()
                .filter(|_| commands_in_block > 0)
                .unwrap_or_else(|| panic!("{at}: output before any `$ fleet` command"));
            if let Some(code) = line
                .strip_prefix("[exit ")
                .and_then(|r| r.strip_suffix(']'))
            {
                ex.exit = code
                    .parse()
                    .unwrap_or_else(|_| panic!("{at}: `{line}` is not an exit status"));
            } else {
                assert!(
                    ex.exit == 0,
                    "{at}: `[exit N]` must be the last line of an output"
                );
                ex.expected.push(line.trim_end().to_string());
            }
        }
    }
    assert!(
        !in_block,
        "{}: a console block is never closed",
        rel.display()
    );
    out
}

/// `pattern` against one line: `[..]` matches any text.
fn line_matches(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split("[..]").collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !text.starts_with(first) || text.len() < first.len() + last.len() || !text.ends_with(last) {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(i) => rest = &rest[i + mid.len()..],
            None => return false,
        }
    }
    true
}

/// Expected lines against actual ones: a line `...` matches any number of lines.
fn lines_match(expected: &[String], actual: &[&str]) -> bool {
    match expected.split_first() {
        None => actual.is_empty(),
        Some((e, rest)) if e == "..." => {
            (0..=actual.len()).any(|k| lines_match(rest, &actual[k..]))
        }
        Some((e, rest)) => {
            !actual.is_empty() && line_matches(e, actual[0]) && lines_match(rest, &actual[1..])
        }
    }
}

/// Runs one example as a user would type it, from the repository root, with the built binaries
/// first on PATH and nothing of this machine's fleet environment; stdout and stderr together.
fn run(command: &str, scratch: &Path) -> (i32, String) {
    let bin = fleet().parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("timeout")
        .args(["120", "bash", "-c"])
        .arg(format!("exec 2>&1\n{command}"))
        .current_dir(root())
        .env("PATH", path)
        .env("FLEET_RUN_DIR", scratch.join("run"))
        .env("HOME", scratch.join("home"))
        .env("COLUMNS", "100")
        .env("NO_COLOR", "1")
        .env_remove("FLEET_CONFIG")
        .env_remove("FLEET_PROFILES_DIR")
        .env_remove("FLEET_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run bash: {e}"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn the_console_examples_run_as_written() {
    let scratch = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(scratch.path().join("home")).unwrap();
    let all: Vec<Example> = markdown_files().iter().flat_map(|f| examples(f)).collect();
    assert!(
        all.len() >= 20,
        "only {} console examples in README.md and docs/: the harness lost them",
        all.len()
    );
    let mut failures = Vec::new();
    for ex in &all {
        let (code, output) = run(&ex.command, scratch.path());
        let mut actual: Vec<&str> = output.lines().map(str::trim_end).collect();
        while actual.last() == Some(&"") {
            actual.pop();
        }
        if code != ex.exit || !lines_match(&ex.expected, &actual) {
            failures.push(format!(
                "{}: `{}`\n  expected exit {}, got {code}\n  expected:\n{}\n  got:\n{}",
                ex.at,
                ex.command,
                ex.exit,
                indent(&ex.expected.join("\n")),
                indent(&actual.join("\n"))
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} examples differ:\n\n{}",
        failures.len(),
        all.len(),
        failures.join("\n\n")
    );
}

fn indent(s: &str) -> String {
    s.lines()
        .map(|l| format!("    | {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_example_matcher_is_strict_where_it_is_not_told_otherwise() {
    let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert!(lines_match(&v(&["a", "b"]), &["a", "b"]));
    assert!(
        !lines_match(&v(&["a"]), &["a", "b"]),
        "extra output is a difference"
    );
    assert!(
        !lines_match(&v(&[]), &["a"]),
        "no expected lines means no output"
    );
    assert!(lines_match(&v(&["a", "..."]), &["a", "b", "c"]));
    assert!(lines_match(&v(&["...", "c"]), &["a", "b", "c"]));
    assert!(lines_match(&v(&["a", "...", "c"]), &["a", "c"]));
    assert!(!lines_match(&v(&["a", "...", "d"]), &["a", "b", "c"]));
    assert!(line_matches("took [..] s", "took 0.01 s"));
    assert!(line_matches("[..]x[..]y", "axbyc y"));
    assert!(!line_matches("took [..] s", "took 0.01 ms!"));
    assert!(!line_matches("ab[..]ba", "aba"), "the ends may not overlap");
}

// ------------------------------------------------------------------------------------------
// Links

/// The text of a line with its inline code spans taken out (a link inside backticks is none).
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(i) = rest.find('`') {
        out.push_str(&rest[..i]);
        let n = rest[i..].chars().take_while(|&c| c == '`').count();
        let tick = &rest[i..i + n];
        match rest[i + n..].find(tick) {
            Some(j) => rest = &rest[i + n + j + n..],
            None => {
                rest = &rest[i + n..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The targets of the `[text](target)` links (and images) of a line.
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code_spans(line);
    let mut out = Vec::new();
    let mut rest = line.as_str();
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        let Some(end) = after.find(')') else { break };
        let target = after[..end].split_whitespace().next().unwrap_or("");
        out.push(target.trim_matches(|c| c == '<' || c == '>').to_string());
        rest = &after[end..];
    }
    out
}

/// GitHub's anchor for a heading's text.
fn slug(heading: &str) -> String {
    // A link in a heading anchors by its text.
    let mut text = String::new();
    let mut rest = heading;
    while let Some(i) = rest.find("](") {
        text.push_str(&rest[..i]);
        rest = rest[i + 2..].split_once(')').map_or("", |(_, r)| r);
    }
    text.push_str(rest);
    text.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings, repeated ones numbered as GitHub does.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for (_, line, info) in lines_with_fences(text) {
        if info.is_some() || !line.starts_with('#') {
            continue;
        }
        let text = line.trim_start_matches('#');
        if !text.starts_with(' ') {
            continue;
        }
        let s = slug(text.trim().trim_end_matches('#').trim());
        let n = seen.entry(s.clone()).or_insert(0);
        out.insert(if *n == 0 {
            s.clone()
        } else {
            format!("{s}-{n}")
        });
        *n += 1;
    }
    out
}

fn broken_links(rel: &Path) -> Vec<String> {
    let text = read(rel);
    let dir = rel.parent().unwrap_or(Path::new(""));
    let mut broken = Vec::new();
    for (n, line, info) in lines_with_fences(&text) {
        if info.is_some() {
            continue;
        }
        for target in link_targets(line) {
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let file = if path.is_empty() {
                rel.to_path_buf()
            } else {
                dir.join(path)
            };
            let at = format!("{}:{n}: `{target}`", rel.display());
            if !root().join(&file).exists() {
                broken.push(format!("{at}: no such file"));
                continue;
            }
            if !anchor.is_empty() && file.extension().is_some_and(|x| x == "md") {
                let heads = anchors(&std::fs::read_to_string(root().join(&file)).unwrap());
                if !heads.contains(anchor) {
                    broken.push(format!(
                        "{at}: no heading `#{anchor}` in {}",
                        file.display()
                    ));
                }
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let files = markdown_files();
    let broken: Vec<String> = files.iter().flat_map(|f| broken_links(f)).collect();
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_link_checker_sees_what_is_broken() {
    assert_eq!(
        link_targets("see [a](x.md#b), `[c](nope.md)` and ![i](p.png \"t\")"),
        vec!["x.md#b", "p.png"]
    );
    assert_eq!(
        slug("OpenAI Batch API output (`--output-format openai-batch`)"),
        "openai-batch-api-output---output-format-openai-batch"
    );
    assert_eq!(
        slug("Detached jobs: `fleet generate --detach`"),
        "detached-jobs-fleet-generate---detach"
    );
    let heads = anchors("# A\n```\n# not a heading\n```\n## A\n");
    assert_eq!(heads, BTreeSet::from(["a".to_string(), "a-1".to_string()]));
}

#[test]
fn the_summary_lists_every_page_and_only_pages() {
    let summary = read(Path::new("docs/SUMMARY.md"));
    let listed: BTreeSet<PathBuf> = summary
        .lines()
        .flat_map(link_targets)
        .map(|t| Path::new("docs").join(t))
        .collect();
    let pages: BTreeSet<PathBuf> = markdown_files()
        .into_iter()
        .filter(|p| p.starts_with("docs") && p != Path::new("docs/SUMMARY.md"))
        .collect();
    let unlisted: Vec<_> = pages.difference(&listed).collect();
    let missing: Vec<_> = listed.difference(&pages).collect();
    assert!(
        unlisted.is_empty(),
        "pages docs/SUMMARY.md does not list: {unlisted:?}"
    );
    assert!(
        missing.is_empty(),
        "docs/SUMMARY.md lists pages that do not exist: {missing:?}"
    );
}

// ------------------------------------------------------------------------------------------
// `fleet --help` and the reference

fn help(args: &[&str]) -> String {
    let out = Command::new(fleet())
        .args(args)
        .env("COLUMNS", "100")
        .output()
        .unwrap();
    assert!(out.status.success(), "fleet {args:?} failed");
    String::from_utf8(out.stdout).unwrap()
}

/// The names under a help text's `Commands:` heading, `help` left out.
fn subcommands(help: &str) -> Vec<String> {
    let Some((_, after)) = help.split_once("\nCommands:\n") else {
        return Vec::new();
    };
    after
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| *n != "help")
        .map(str::to_string)
        .collect()
}

/// The long flags of a `--help` text's option lines.
fn long_flags(help: &str) -> BTreeSet<String> {
    help.lines()
        .filter(|l| {
            let indent = l.len() - l.trim_start().len();
            indent <= 6 && l.trim_start().starts_with('-')
        })
        .flat_map(|l| l.split([' ', ',']).map(str::to_string).collect::<Vec<_>>())
        .map(|w| w.trim_end_matches("...").to_string())
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .collect()
}

/// Whether `text` names `flag` as a whole word (`--out` is not named by `--output-format`).
fn names_flag(text: &str, flag: &str) -> bool {
    text.match_indices(flag).any(|(i, _)| {
        let next = text[i + flag.len()..].chars().next();
        !next.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    })
}

#[test]
fn every_subcommand_has_its_page_naming_each_flag_and_its_help_points_there() {
    let top = help(&["--help"]);
    let commands = subcommands(&top);
    assert!(
        commands.len() >= 10,
        "too few subcommands read from fleet --help: {commands:?}"
    );
    let mut problems = Vec::new();
    for c in &commands {
        let page = format!("docs/reference/{c}.md");
        let Ok(text) = std::fs::read_to_string(root().join(&page)) else {
            problems.push(format!("`fleet {c}` has no page {page}"));
            continue;
        };
        let mut helps = vec![(format!("fleet {c}"), help(&[c, "--help"]))];
        for s in subcommands(&helps[0].1) {
            helps.push((format!("fleet {c} {s}"), help(&[c, &s, "--help"])));
        }
        for (name, h) in &helps {
            if !h.contains(&format!("Manual: {page}")) {
                problems.push(format!(
                    "`{name} --help` does not end with `Manual: {page}`"
                ));
            }
            for flag in long_flags(h) {
                if !names_flag(&text, &flag) {
                    problems.push(format!("{page} does not mention `{name}`'s {flag}"));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "the reference and --help disagree:\n{}",
        problems.join("\n")
    );
}

#[test]
fn every_flag_has_a_one_line_short_help() {
    fn walk(cmd: &clap::Command, path: &str, problems: &mut Vec<String>) {
        for arg in cmd.get_arguments() {
            let name = arg
                .get_long()
                .map_or_else(|| arg.get_id().to_string(), |l| format!("--{l}"));
            match arg.get_help().map(|h| h.to_string()) {
                None => problems.push(format!("{path} {name}: no help")),
                Some(h) if h.contains('\n') || h.chars().count() > 100 => problems.push(format!(
                    "{path} {name}: its short help is {} characters; keep one line of at most 100 \
                     (a blank `///` line after the first sentence moves the rest to --help)",
                    h.chars().count()
                )),
                Some(_) => {}
            }
        }
        for sub in cmd.get_subcommands() {
            walk(sub, &format!("{path} {}", sub.get_name()), problems);
        }
    }
    let mut cmd = fleet::cli::Cli::command();
    cmd.build();
    let mut problems = Vec::new();
    walk(&cmd, "fleet", &mut problems);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ------------------------------------------------------------------------------------------
// The map of src/ and the environment page

#[test]
fn the_architecture_page_maps_every_top_level_module() {
    let page = read(Path::new("docs/internals/architecture.md"));
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(root().join("src")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        let module = format!("src/{name}");
        if !page.contains(&module) {
            missing.push(module);
        }
    }
    assert!(
        missing.is_empty(),
        "docs/internals/architecture.md does not map {missing:?}"
    );
}

#[test]
fn the_environment_page_names_every_fleet_variable_the_code_reads() {
    fn walk(dir: &Path, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for (i, _) in text.match_indices("\"FLEET_") {
                    let name: String = text[i + 1..]
                        .chars()
                        .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                        .collect();
                    if text[i + 1 + name.len()..].starts_with('"') {
                        out.insert(name);
                    }
                }
            }
        }
    }
    let mut vars = BTreeSet::new();
    walk(&root().join("src"), &mut vars);
    assert!(vars.contains("FLEET_RUN_DIR"), "the scan found {vars:?}");
    let page = read(Path::new("docs/reference/environment.md"));
    let missing: Vec<_> = vars.iter().filter(|v| !names_flag(&page, v)).collect();
    assert!(
        missing.is_empty(),
        "docs/reference/environment.md does not name {missing:?}"
    );
}

/// `NAME` of a `NAME=value` prefix: what a shell takes as a variable for one command.
fn is_env_name(word: &str) -> bool {
    !word.is_empty()
        && !word.starts_with(|c: char| c.is_ascii_digit())
        && word.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}
