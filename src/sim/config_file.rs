//! SGLang's `--config FILE.yaml`: the file's settings become flags put before the command
//! line's own, so the command line wins (srt/utils/server_args_config_parser.py,
//! `ConfigArgumentMerger`, as `prepare_server_args` in srt/server_args.py applies it).

use serde_json::Value as Json;

use crate::sim::argparse::{Nargs, OptSpec, Parser};
use crate::sim::server_args::Refusal;

const FILE: &str = "srt/utils/server_args_config_parser.py";

fn refused(function: &'static str, line: u32, code: &'static str, error: String) -> Refusal {
    Refusal {
        file: FILE,
        function,
        line,
        code,
        error: format!("ValueError: {error}"),
    }
}

/// `args` with the settings of its `--config` file merged in, as SGLang 0.5.23 does: only the
/// exact token `--config` counts (`"--config" in argv`), one at most.
pub fn merge(parser: &Parser, args: &[String]) -> Result<Vec<String>, Refusal> {
    let at: Vec<usize> = (0..args.len()).filter(|i| args[*i] == "--config").collect();
    let Some(&index) = at.first() else {
        return Ok(args.to_vec());
    };
    if at.len() > 1 {
        return Err(refused(
            "_extract_config_file_path",
            125,
            "raise ValueError(\"Multiple config files specified! Only one allowed.\")",
            "Multiple config files specified! Only one allowed.".into(),
        ));
    }
    let Some(path) = args.get(index + 1) else {
        return Err(refused(
            "_extract_config_file_path",
            132,
            "raise ValueError(\"No config file specified after --config flag!\")",
            "No config file specified after --config flag!".into(),
        ));
    };
    let config = read(path)?;
    let mut merged = to_args(parser, &config)?;
    merged.extend(args[..index].iter().cloned());
    merged.extend(args[index + 2..].iter().cloned());
    Ok(merged)
}

/// `_validate_yaml_file` and `_parse_yaml_config`.
fn read(path: &str) -> Result<serde_json::Map<String, Json>, Refusal> {
    let suffix = std::path::Path::new(path)
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default();
    if !matches!(suffix.to_lowercase().as_str(), ".yaml" | ".yml") {
        return Err(refused(
            "_validate_yaml_file",
            172,
            "raise ValueError(f\"Config file must be YAML format, got: {path.suffix}\")",
            format!("Config file must be YAML format, got: {suffix}"),
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|_| {
        refused(
            "_validate_yaml_file",
            175,
            "raise ValueError(f\"Config file not found: {file_path}\")",
            format!("Config file not found: {path}"),
        )
    })?;
    let root = if text.trim().is_empty() {
        Json::Null
    } else {
        serde_saphyr::from_str::<Json>(&text).map_err(|e| Refusal {
            file: FILE,
            function: "_parse_yaml_config",
            line: 150,
            code: "config_data = yaml.safe_load(file)",
            error: format!("yaml.YAMLError: {e}"),
        })?
    };
    match root {
        Json::Null => Ok(serde_json::Map::new()),
        Json::Object(map) => Ok(map),
        _ => Err(refused(
            "_parse_yaml_config",
            162,
            "raise ValueError(\"Config file must contain a dictionary at root level\")",
            "Config file must contain a dictionary at root level".into(),
        )),
    }
}

/// The keys a YAML setting may use for an option: its dest and every long spelling.
fn keys(spec: &OptSpec) -> Vec<String> {
    let mut keys = vec![spec.dest()];
    keys.extend(
        spec.names
            .iter()
            .filter_map(|n| n.strip_prefix("--"))
            .map(|n| n.replace('-', "_")),
    );
    keys
}

/// A BooleanOptionalAction (it has a `--no-x` spelling): neither store_true nor one value, so
/// SGLang refuses it in a config file.
fn boolean_optional(spec: &OptSpec) -> bool {
    let negated = format!("--no-{}", spec.names[0].trim_start_matches("--"));
    spec.names.contains(&negated)
}

/// `_convert_config_to_args`: `key: value` becomes `--key value` with the key as written.
fn to_args(
    parser: &Parser,
    config: &serde_json::Map<String, Json>,
) -> Result<Vec<String>, Refusal> {
    let specs: Vec<&OptSpec> = parser.groups.iter().flat_map(|(_, g)| g).collect();
    let find = |key: &str| specs.iter().find(|s| keys(s).iter().any(|k| k == key));
    let mut args = Vec::new();
    for (key, value) in config {
        let norm = key.replace('-', "_");
        let spec = find(&norm);
        if spec.is_some_and(|s| boolean_optional(s)) {
            return Err(refused(
                "_convert_config_to_args",
                196,
                "raise ValueError(msg)",
                format!("Unsupported config option '{norm}' with action 'BooleanOptionalAction'"),
            ));
        }
        let store_true = spec.is_some_and(|s| s.nargs == Nargs::Zero);
        match value {
            Json::Bool(on) if store_true => {
                if *on {
                    args.push(format!("--{key}"));
                }
            }
            Json::Bool(on) => args.extend([format!("--{key}"), on.to_string()]),
            Json::Array(items) => {
                if !items.is_empty() {
                    args.push(format!("--{key}"));
                    args.extend(items.iter().map(py_str));
                }
            }
            Json::Object(_) => args.extend([format!("--{key}"), value.to_string()]),
            other => args.extend([format!("--{key}"), py_str(other)]),
        }
    }
    Ok(args)
}

/// Python's `str()` of a YAML scalar.
fn py_str(v: &Json) -> String {
    match v {
        Json::Null => "None".into(),
        Json::Bool(true) => "True".into(),
        Json::Bool(false) => "False".into(),
        Json::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::config::parser_for;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    fn file(name: &str, text: &str) -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        (dir, path.to_string_lossy().into_owned())
    }

    #[test]
    fn the_file_goes_first_so_the_command_line_wins() {
        let parser = parser_for("0.5.23", "3.11").unwrap();
        let (_dir, path) = file(
            "s.yaml",
            "api-key: \"sk \\\"x\\\"\"\nenable_metrics: true\ndisable_radix_cache: false\nport: 31000\n",
        );
        let merged = merge(
            &parser,
            &s(&["--model", "/m", "--config", &path, "--port", "1"]),
        )
        .unwrap();
        assert_eq!(
            merged,
            s(&[
                "--api-key",
                "sk \"x\"",
                "--enable_metrics",
                "--port",
                "31000",
                "--model",
                "/m",
                "--port",
                "1"
            ])
        );
        assert_eq!(
            merge(&parser, &s(&["--model", "/m"])).unwrap(),
            s(&["--model", "/m"])
        );
    }

    #[test]
    fn bad_config_files_are_sglangs_value_errors() {
        let parser = parser_for("0.5.23", "3.11").unwrap();
        let err = |args: &[&str]| merge(&parser, &s(args)).unwrap_err().error;
        assert_eq!(
            err(&["--config", "a.yaml", "--config", "b.yaml"]),
            "ValueError: Multiple config files specified! Only one allowed."
        );
        assert_eq!(
            err(&["--config"]),
            "ValueError: No config file specified after --config flag!"
        );
        assert_eq!(
            err(&["--config", "/x/s.json"]),
            "ValueError: Config file must be YAML format, got: .json"
        );
        assert_eq!(
            err(&["--config", "/nonexistent/s.yaml"]),
            "ValueError: Config file not found: /nonexistent/s.yaml"
        );
        let (_dir, list) = file("l.yml", "- a\n- b\n");
        assert_eq!(
            err(&["--config", &list]),
            "ValueError: Config file must contain a dictionary at root level"
        );
    }
}
