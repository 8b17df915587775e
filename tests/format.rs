//! One `--format text|json|html` for every result, through the real binary on a local simulated
//! fleet: `up`, `status`, `gpus`, `profile show`, `generate` and `progress DIR` each print text
//! (as without the flag), JSON (the same as `--json`) and one self-contained page (nothing remote)
//! that headless Chromium renders offline with the command's numbers; a bad value is clap's
//! clear error.

mod common;

use std::path::Path;

use common::chromium::rendered_dom;
use common::generate::{Sim, generate, write_prompts};
use common::local_fleet::LocalFleet;
use serde_json::Value;

/// `fleet ARGS` in the fleet's dir: (exit code, stdout, stderr).
fn run(f: &LocalFleet, args: &[&str]) -> (i32, String, String) {
    let o = f.fleet().args(args).output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The command's result in every format: its text (checked to be what `--format text` gives, to
/// its first line when `Live`: figures that move between two looks), its JSON (checked to be
/// what `--json` gives, up to `same`), and the DOM Chromium renders from its page.
struct Rendered {
    text: String,
    json: Value,
    dom: String,
}

#[derive(Clone, Copy, PartialEq)]
enum Figures {
    Fixed,
    Live,
}

fn every_format(
    f: &LocalFleet,
    args: &[&str],
    figures: Figures,
    same: impl Fn(&Value, &Value),
) -> Rendered {
    let with = |flags: &[&str]| {
        let all: Vec<&str> = flags.iter().chain(args).copied().collect();
        let (code, out, err) = run(f, &all);
        assert_eq!(code, 0, "fleet {}: {err}", all.join(" "));
        out
    };
    let text = with(&[]);
    let first = |t: &str| t.lines().next().unwrap_or_default().to_string();
    match figures {
        Figures::Fixed => assert_eq!(with(&["--format", "text"]), text, "{args:?}"),
        Figures::Live => assert_eq!(first(&with(&["--format", "text"])), first(&text)),
    }
    let json: Value = serde_json::from_str(&with(&["--format", "json"]))
        .unwrap_or_else(|e| panic!("{args:?}: --format json is not JSON: {e}"));
    let alias: Value = serde_json::from_str(&with(&["--json"])).unwrap();
    same(&json, &alias);
    let page = with(&["--format", "html"]);
    assert!(page.starts_with("<!DOCTYPE html>"), "{args:?}: {page}");
    for remote in ["src=", "href=", "<script", "<link", "@import", "url("] {
        assert!(!page.contains(remote), "{args:?}: the page has {remote:?}");
    }
    // A URL may be data (an instance's `url`), shown as text; no tag may hold one.
    for tag in page
        .split('<')
        .filter_map(|t| t.split_once('>'))
        .map(|(t, _)| t)
    {
        assert!(!tag.contains("://"), "{args:?}: a URL in <{tag}>");
    }
    let name = args.join("-").replace('/', "_");
    let html = f.path().join(format!("{name}.html"));
    std::fs::write(&html, &page).unwrap();
    let dom = rendered_dom(&f.path().join(format!("chromium-{name}")), &html);
    Rendered { text, json, dom }
}

fn equal(a: &Value, b: &Value) {
    assert_eq!(a, b, "--format json and --json differ");
}

/// A cell of the page with exactly `text` in it.
fn has_cell(dom: &str, text: impl std::fmt::Display) -> bool {
    dom.contains(&format!(">{text}</td>"))
}

fn sim_profile(f: &LocalFleet) {
    let ports = common::reserve_ports(1);
    f.write_profile(
        "sim",
        &format!(
            "model: /models/test\nlauncher: [sglang-sim]\nport_base: {}\n\
             env:\n  SGLANG_SIM_STARTUP_SECS: \"1\"\n  SGLANG_SIM_GPU_STATE_DIR: \"{}\"\n\
             health: {{startup_timeout: 60s, poll: 1s}}\n",
            ports.base,
            f.gpu_state().display()
        ),
    );
}

#[test]
fn fleet_commands_render_as_text_json_and_an_offline_page() {
    let f = LocalFleet::new(1);
    sim_profile(&f);

    let shown = every_format(&f, &["profile", "show", "sim"], Figures::Fixed, equal);
    let port_base = shown.json["port_base"].as_u64().unwrap();
    assert!(shown.text.contains(&format!("port_base: {port_base}")));
    assert!(has_cell(&shown.dom, port_base), "{}", shown.dom);
    assert!(shown.dom.contains("sglang-sim"), "{}", shown.dom);

    let (code, up, err) = run(&f, &["--format", "json", "up", "--profile", "sim"]);
    assert_eq!(code, 0, "{err}");
    let up: Value = serde_json::from_str(&up).unwrap();
    assert_eq!(up.as_array().unwrap().len(), 1, "{up}");

    // Load and uptime move between two looks; what the instance is does not.
    let status = every_format(&f, &["status"], Figures::Live, |a, b| {
        assert_eq!(a[0]["port"], b[0]["port"]);
        assert_eq!(a[0]["liveness"], b[0]["liveness"]);
    });
    let port = status.json[0]["port"].as_u64().unwrap();
    assert_eq!(port, port_base);
    assert!(status.text.contains(&port.to_string()), "{}", status.text);
    assert!(has_cell(&status.dom, port), "{}", status.dom);

    let gpus = every_format(&f, &["gpus"], Figures::Live, |a, b| {
        assert_eq!(a[0]["host"], b[0]["host"]);
        assert_eq!(a[0]["gpus"][0]["uuid"], b[0]["gpus"][0]["uuid"]);
    });
    let gpu = &gpus.json[0]["gpus"][0];
    let used = gpu["memory_used_mib"].as_u64().unwrap();
    assert!(used > 0, "the sim holds memory on GPU 0: {gpu}");
    assert!(
        gpus.text.contains(&format!("{used} / 97887 MiB")),
        "{}",
        gpus.text
    );
    assert!(
        has_cell(&gpus.dom, used) && has_cell(&gpus.dom, 97887),
        "{}",
        gpus.dom
    );
    assert!(gpus.dom.contains("local"), "{}", gpus.dom);
}

#[test]
fn a_job_renders_as_its_report_page_and_its_progress_in_every_format() {
    let f = LocalFleet::new(1);
    let sim = Sim::start(&["--sim-time-scale", "100"]);
    let prompts = f.path().join("prompts.jsonl");
    write_prompts(&prompts, 40);
    let out = f.path().join("job");
    // `generate --format html` ends with the job's report page on stdout.
    // A named server: the page then holds no URL at all.
    let o = generate(&out, &prompts, &[&format!("sim={}", sim.url)])
        .args(["--max-tokens", "16", "--format", "html"])
        .output()
        .unwrap();
    let page = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(page.starts_with("<!DOCTYPE html>"), "{page}");
    assert!(page.contains(r#"<td id="job-completed">40</td>"#), "{page}");
    assert!(!page.contains("http://") && !page.contains("https://"));

    let dir = out.display().to_string();
    let progress = every_format(&f, &["progress", &dir], Figures::Fixed, equal);
    let file: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("progress.json")).unwrap()).unwrap();
    // The model is the file's figures (and a finished job has no finding).
    for key in [
        "completed",
        "total",
        "failed",
        "total_output_tokens",
        "status",
    ] {
        assert_eq!(progress.json[key], file[key], "{key}");
    }
    assert_eq!(progress.json["completed"], 40);
    assert!(progress.json.get("findings").is_none(), "{}", progress.json);
    assert!(
        progress.text.contains("done        40/40"),
        "{}",
        progress.text
    );
    let tokens = file["total_output_tokens"].as_u64().unwrap();
    assert!(has_cell(&progress.dom, 40) && has_cell(&progress.dom, tokens));
    let instance = file["instances"][0]["name"].as_str().unwrap();
    assert!(has_cell(&progress.dom, instance), "{}", progress.dom);
    report_formats(&f, &out);
}

/// `fleet report` takes the global `--format` (and `--json`) like every command.
fn report_formats(f: &LocalFleet, job: &Path) {
    let job = job.display().to_string();
    let (code, page, err) = run(f, &["report", &job, "--format", "html"]);
    assert_eq!(code, 0, "{err}");
    assert!(page.contains(r#"<td id="job-total">40</td>"#), "{page}");
    let (_, json, _) = run(f, &["--format", "json", "report", &job]);
    let (_, alias, _) = run(f, &["--json", "report", &job]);
    let json: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json, serde_json::from_str::<Value>(&alias).unwrap());
    assert_eq!(json["job"]["progress"]["completed"], 40);
}

#[test]
fn a_bad_format_is_a_clear_usage_error() {
    let f = LocalFleet::new(1);
    let (code, out, err) = run(&f, &["--format", "xml", "gpus"]);
    assert_eq!(code, 2, "{out}");
    assert!(
        err.contains("invalid value 'xml' for '--format <FORMAT>'")
            && err.contains("[possible values: text, json, html]"),
        "{err}"
    );
    let (code, _, err) = run(&f, &["--json", "--format", "text", "gpus"]);
    assert_eq!(code, 2);
    assert!(err.contains("cannot be used with"), "{err}");
}
