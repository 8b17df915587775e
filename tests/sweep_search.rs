//! `fleet sweep` searching ranges end to end on `sglang-sim`, 8 GPUs: the adaptive search over
//! two strategies × the static fraction × the decode graph bound finds a config within 3% of
//! the space's best (by the sim's own model, `fleet::sim::best`) without crowning an OOM,
//! confirms its close leaders with a second window and crowns on the pooled figures, and
//! `fleet report` charts it; under `--slo ttft_p99<=1.6s,itl_p99<=250ms` it crowns the fastest
//! config that keeps both; of configs alike within their windows' noise, the one farther from
//! the out-of-memory edge is crowned and the report says they tie; an interrupted search
//! resumes without running a finished trial again; a bad `--slo` and a flag axis the host's
//! SGLang does not know by that exact name are refused before anything starts.

mod common;
mod sweep_common;

use fleet::sim::best::{self, Space};
use fleet::sim::{Params, Settings, Strategy};
use serde_json::Value;
use sweep_common::{Fleet, serial};

/// 1 s of warm-up and a 4 s window, short prompts.
const TRIALS: &[&str] = &[
    "--input-len",
    "32",
    "--output-len",
    "24",
    "--warmup",
    "1s",
    "--duration",
    "4s",
];

#[test]
fn the_adaptive_search_finds_the_best_of_a_ranged_space_without_crowning_an_oom() {
    let _g = serial();
    let f = Fleet::new(8, &["mem_fraction_static: 0.85"], &[]);
    let args = search_args(&["--trials", "24"]);
    let (code, r, err) = f.sweep_json(&args);
    assert_eq!(code, 0, "{err}");
    let file = f.file();
    assert_eq!(file["spec"]["search"]["strategy"], "adaptive", "{file:#}");
    assert_eq!(file["search"]["stopped"], "trials");
    let trials = file["trials"].as_array().unwrap();
    // 24 explored, then the close leaders each measured once more (a round of the GPUs at
    // most), so that a lucky window is not crowned.
    let again: Vec<&Value> = trials
        .iter()
        .filter(|t| t["candidate"]["repeat"] == 1)
        .collect();
    assert_eq!(trials.len() - again.len(), 24, "{}", summary(trials));
    assert!((2..=8).contains(&again.len()), "{}", summary(trials));
    for t in &again {
        let first = trials
            .iter()
            .find(|e| {
                e["candidate"]["repeat"].is_null()
                    && e["candidate"]["settings"] == t["candidate"]["settings"]
            })
            .expect("a second window of an explored config");
        assert_eq!(first["outcome"]["state"], "ok");
        assert_eq!(
            t["outcome"]["state"], "ok",
            "a confirmation is never pruned"
        );
    }
    let won_row = r["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["winner"] == true)
        .expect("a winner");
    assert_eq!(
        won_row["windows"], 2,
        "the winner's figure pools both its windows"
    );
    let pooled = won_row["trial"]["outcome"]["output_tok_s_per_gpu"]
        .as_f64()
        .unwrap();
    let windows: Vec<f64> = trials
        .iter()
        .filter(|t| t["candidate"]["settings"] == won_row["trial"]["candidate"]["settings"])
        .map(tok_s)
        .collect();
    assert_eq!(windows.len(), 2);
    assert!(
        (pooled - (windows[0] + windows[1]) / 2.0).abs() < 1e-6,
        "{pooled} {windows:?}"
    );
    // The profile's own values lead: its static fraction, the middle of the rest.
    let first = file["search"]["proposed"][0]["id"].as_str().unwrap();
    assert!(
        first.contains("server.mem_fraction_static=0.850"),
        "{first}"
    );
    // Graphs up to 512 do not fit beside a 0.94 static pool: some candidates fail to start,
    // typed as out of memory from the server's log.
    let ooms: Vec<_> = trials
        .iter()
        .filter(|t| t["outcome"]["state"] == "failed")
        .collect();
    assert!(
        ooms.iter().all(|t| t["outcome"]["kind"] == "out_of_memory"),
        "{ooms:#?}"
    );
    let winner = r["winner"].as_str().expect("a winner").to_string();
    let won = trials
        .iter()
        .find(|t| t["candidate"]["id"] == winner.as_str() || label(t) == winner)
        .unwrap_or_else(|| panic!("{winner} in {file:#}"));
    assert_eq!(won["outcome"]["state"], "ok", "an OOM is never crowned");
    // The space's best by the sim's own model: no_buffer just below the out-of-memory edge,
    // its graph bound just above its cap.
    let best = best::best(&params(), &base(), &Space::issue(), None).unwrap();
    assert!(best.cuda_graph_max_bs <= best.cap + 1 && best.mem_fraction_static < 0.94);
    let found = model(won).expect("the winner loads by the model");
    // The model is the sim's: the server itself reports the same figure.
    let (strategy, mem, bs) = (
        setting(won, "server.mamba_strategy"),
        setting(won, "server.mem_fraction_static"),
        setting(won, "flag.cuda-graph-max-bs-decode"),
    );
    let extra = format!("[--cuda-graph-max-bs-decode, \"{bs}\"]");
    let served = f.ideal(&[
        ("server.mamba_strategy", &strategy),
        ("server.mem_fraction_static", &mem),
        ("server.extra_args", &extra),
    ]);
    assert!(
        (served - found.tok_s).abs() < 0.01 * found.tok_s,
        "{served} vs {found:?}"
    );
    // fleet report charts the search: throughput against each axis, OOM points marked, and
    // the best over the trials.
    let page = f.path().join("report.html");
    let (code, _, err) = f.fleet(&[
        "report",
        f.path().join("sweep.json").to_str().unwrap(),
        "-o",
        page.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let html = std::fs::read_to_string(&page).unwrap();
    for id in [
        "search-axis-0",
        "search-axis-1",
        "search-axis-2",
        "search-best",
        "search-table",
    ] {
        assert!(html.contains(&format!("id=\"{id}\"")), "{id}");
    }
    if !ooms.is_empty() {
        assert!(html.contains("class=\"oom\""), "OOM points are marked");
    }
    assert!(
        found.tok_s >= 0.97 * best.tok_s,
        "{winner}: {:.0} tok/s against the best {:.0}; trials:\n{}",
        found.tok_s,
        best.tok_s,
        summary(trials)
    );
    assert!(f.records().is_empty(), "nothing left running");
}

/// The sims' parameters as the sweep tests' base profile sets them.
fn params() -> Params {
    Params {
        mean_output_tokens: 40,
        ..Params::default()
    }
}

fn base() -> Settings {
    Settings {
        context_length: Some(8192),
        ..Settings::default()
    }
}

fn setting(t: &Value, key: &str) -> String {
    t["candidate"]["settings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s[0] == key)
        .map(|s| s[1].as_str().unwrap().to_string())
        .unwrap_or_else(|| panic!("no {key} in {t:#}"))
}

/// What the sim's model says of a trial's candidate; `None`: it does not load.
fn model(t: &Value) -> Option<best::Point> {
    let strategy = match setting(t, "server.mamba_strategy").as_str() {
        "no_buffer" => Strategy::NoBuffer,
        _ => Strategy::ExtraBuffer,
    };
    best::at(
        &params(),
        &base(),
        strategy,
        setting(t, "server.mem_fraction_static").parse().unwrap(),
        setting(t, "flag.cuda-graph-max-bs-decode").parse().unwrap(),
    )
}

fn summary(trials: &[Value]) -> String {
    trials
        .iter()
        .map(|t| {
            format!(
                "{} {} {} itl p50 {} p99 {}",
                label(t),
                t["outcome"]["state"],
                t["outcome"]["output_tok_s_per_gpu"],
                t["outcome"]["itl_s"]["p50"],
                t["outcome"]["itl_s"]["p99"]
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn label(t: &Value) -> String {
    t["candidate"]["settings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let (k, v) = (s[0].as_str().unwrap(), s[1].as_str().unwrap());
            match k.strip_prefix("server.").unwrap_or(k) {
                "mamba_strategy" => v.to_string(),
                short => format!("{short}={v}"),
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn a_flag_axis_is_checked_against_the_host_s_help_before_anything_starts() {
    let _g = serial();
    let f = Fleet::new(1, &[], &[]);
    let (code, _, err) = f.fleet(&[
        "sweep",
        "--profile",
        "base",
        "--set",
        "flag.cuda-graph-max-bs=8..64",
        "--set",
        "flag.schedule-conservativness=0.5,1.5",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--cuda-graph-max-bs-decode") && err.contains("--cuda-graph-max-bs-prefill"),
        "{err}"
    );
    assert!(
        err.contains("did you mean --schedule-conservativeness?"),
        "{err}"
    );
    assert_eq!(f.busy_gpus(), 0, "nothing started");
}

/// The issue's search on 4 GPUs: `extra` after the axes.
fn search_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "--strategies",
        "no_buffer,extra_buffer",
        "--set",
        "server.mem_fraction_static=0.80..0.94",
        "--set",
        "flag.cuda-graph-max-bs-decode=16..512",
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(TRIALS);
    args
}

fn p99(t: &Value, metric: &str) -> f64 {
    t["outcome"][metric]["p99"]
        .as_f64()
        .unwrap_or(f64::INFINITY)
}

fn tok_s(t: &Value) -> f64 {
    t["outcome"]["output_tok_s_per_gpu"].as_f64().unwrap()
}

#[test]
fn under_an_slo_the_search_crowns_the_best_config_that_keeps_it() {
    let _g = serial();
    let f = Fleet::new(8, &["mem_fraction_static: 0.85"], &[]);
    // A server holds about 1.25x its cap in flight, so a request queued behind the batch waits
    // for a whole answer before its prefill: TTFT p99 is about 26 decode steps (24 tokens, the
    // prefill, the queue), and a step grows with the batch (24.5 + 0.5 ms a request). The
    // fastest configs, with caps over 80, take 1.7-1.85 s; caps under about 70 keep 1.6 s.
    // ITL p99 (a step plus the prefill of the requests admitted before it, 120-165 ms here)
    // is bound loosely: on 2 cores it also measures when the client's thread got to read.
    let (ttft, itl) = (1.6, 0.25);
    let args = search_args(&["--trials", "24", "--slo", "ttft_p99<=1.6s,itl_p99<=250ms"]);
    let (code, r, err) = f.sweep_json(&args);
    assert_eq!(code, 0, "{err}");
    let file = f.file();
    let metrics: Vec<&str> = file["spec"]["slo"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["metric"].as_str().unwrap())
        .collect();
    assert_eq!(metrics, ["ttft_p99", "itl_p99"], "{:#}", file["spec"]);
    let trials = file["trials"].as_array().unwrap();
    // Each config once, its windows pooled: what the winner is chosen from.
    let rows: Vec<&Value> = r["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|row| row["trial"]["outcome"]["state"] == "ok")
        .collect();
    let keeps =
        |row: &Value| p99(&row["trial"], "ttft_s") <= ttft && p99(&row["trial"], "itl_s") <= itl;
    let fastest = rows
        .iter()
        .max_by(|a, b| tok_s(&a["trial"]).total_cmp(&tok_s(&b["trial"])))
        .unwrap();
    let kept = rows
        .iter()
        .filter(|row| keeps(row))
        .max_by(|a, b| tok_s(&a["trial"]).total_cmp(&tok_s(&b["trial"])))
        .unwrap_or_else(|| panic!("nothing kept the SLO:\n{}", summary(trials)));
    assert!(
        !keeps(fastest),
        "the fastest config breaks the SLO:\n{}",
        summary(trials)
    );
    // Crowned: the fastest of those that keep it; the faster ones are shown with what they broke.
    let winner = rows
        .iter()
        .find(|row| row["winner"] == true)
        .expect("a winner");
    // Or one tied with it within their windows' noise, which asks less memory.
    assert!(
        tok_s(&winner["trial"]) == tok_s(&kept["trial"]) || kept["tied"] == true,
        "{}",
        summary(trials)
    );
    assert!(keeps(winner));
    assert!(winner.get("breaches").is_none(), "{winner:#}");
    assert_eq!(fastest["breaches"][0]["metric"], "ttft_p99", "{fastest:#}");
    assert!(fastest["rank"].as_u64() > winner["rank"].as_u64());
    // By the model, the crowned config holds fewer requests than the space's best.
    let free = best::best(&params(), &base(), &Space::issue(), None).unwrap();
    assert!(model(&kept["trial"]).unwrap().cap < free.cap);
    // The terminal report says so.
    let mut text = vec!["sweep", "--profile", "base", "--resume"];
    text.extend_from_slice(&args);
    let (code, out, err) = f.fleet(&text);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("(breaks SLO)"), "{out}");
    assert!(
        out.contains("breaks --slo: ") && out.contains("ttft_p99 "),
        "{out}"
    );
    // A failed candidate's log tail is shown under it, SGLang's 20,000-character server_args
    // line cut to a screen's width.
    let failed = trials.iter().any(|t| t["outcome"]["state"] == "failed");
    let tail: Vec<&str> = out.lines().filter(|l| l.starts_with("    | ")).collect();
    assert_eq!(failed, !tail.is_empty(), "{out}");
    assert!(tail.iter().all(|l| l.len() < 300), "{out}");
    if failed {
        assert!(
            tail.iter()
                .any(|l| l.contains("server_args=") && l.ends_with(" more characters)")),
            "{out}"
        );
    }
    assert!(f.records().is_empty(), "nothing left running");
}

#[test]
fn a_lead_inside_the_noise_is_a_tie_crowned_farther_from_the_oom_edge() {
    let _g = serial();
    // Four decode graph bounds above the cap a 0.85 pool buys: every batch decodes on a
    // graph, so the four run alike, differ only in the memory their graphs take, and are all
    // confirmed side by side.
    let f = Fleet::new(4, &["mem_fraction_static: 0.85"], &[]);
    let mut args = vec![
        "--search",
        "adaptive",
        "--strategies",
        "no_buffer",
        "--set",
        "flag.cuda-graph-max-bs-decode=240,120,200,160",
    ];
    args.extend_from_slice(TRIALS);
    let (code, _, err) = f.sweep_json(&args);
    assert_eq!(code, 0, "{err}");
    let measured = f.file();
    let trials = measured["trials"].as_array().unwrap();
    let again = trials
        .iter()
        .filter(|t| t["candidate"]["repeat"] == 1)
        .count();
    assert_eq!(again, 4, "{}", summary(trials));
    // The windows' figures set to known ones (the noise of real windows taken out): each
    // bound's first and second window. The second windows of the four disagree with their
    // first by -10, -16, +4 and -24: one window's noise is 8.4 tok/s, the standard error of a
    // difference of two-window means as much, and the means lie within 5 of each other.
    let report = |windows: &[(u32, f64, f64)]| {
        let mut file = measured.clone();
        for t in file["trials"].as_array_mut().unwrap() {
            let bound: u32 = setting(t, "flag.cuda-graph-max-bs-decode").parse().unwrap();
            let (_, first, second) = windows.iter().find(|w| w.0 == bound).unwrap();
            let tok = if t["candidate"]["repeat"] == 1 {
                second
            } else {
                first
            };
            t["outcome"]["output_tok_s_per_gpu"] = (*tok).into();
        }
        std::fs::write(f.path().join("sweep.json"), file.to_string()).unwrap();
        let mut resume = vec!["sweep", "--profile", "base", "--resume"];
        resume.extend_from_slice(&args);
        let (code, out, err) = f.fleet(&resume);
        assert_eq!(code, 0, "{err}");
        let (_, r, _) = f.sweep_json(&resume[3..]);
        (out, r)
    };
    let (out, r) = report(&[
        (120, 1000.0, 990.0),
        (160, 1004.0, 988.0),
        (200, 996.0, 1000.0),
        (240, 1012.0, 988.0),
    ]);
    // The fastest, 240, ties with all three: 120 asks the least memory and is crowned.
    let winner = r["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["winner"] == true);
    let winner = winner.expect("a winner");
    assert_eq!(
        setting(&winner["trial"], "flag.cuda-graph-max-bs-decode"),
        "120"
    );
    assert_eq!(
        (winner["rank"].as_u64(), winner["windows"].as_u64()),
        (Some(1), Some(2))
    );
    assert_eq!(r["tie"].as_array().map(Vec::len), Some(3), "{:#}", r["tie"]);
    let label = winner["label"].as_str().unwrap();
    let line = out
        .lines()
        .find(|l| l.starts_with("tie within noise: "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        line.starts_with(&format!("tie within noise: {label} and "))
            && line.ends_with(&format!(
                "crowned {label}: it asks the least GPU memory of them, the farthest from the out-of-memory edge"
            )),
        "{line}"
    );
    // A lead of 10% over the same noise is no tie: the fastest is crowned, nearest the edge.
    let (out, r) = report(&[
        (120, 1000.0, 990.0),
        (160, 1004.0, 988.0),
        (200, 996.0, 1000.0),
        (240, 1112.0, 1088.0),
    ]);
    assert!(r.get("tie").is_none(), "{:#}", r["tie"]);
    assert!(!out.contains("tie within noise"), "{out}");
    let winner = r["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["winner"] == true);
    let winner = winner.expect("a winner");
    assert_eq!(
        setting(&winner["trial"], "flag.cuda-graph-max-bs-decode"),
        "240"
    );
    assert!(
        out.contains(&format!("winner: {} (", winner["label"].as_str().unwrap())),
        "{out}"
    );
    assert!(f.records().is_empty(), "nothing left running");
}

#[test]
fn a_bad_slo_is_refused_with_a_hint_before_anything_starts() {
    let _g = serial();
    let f = Fleet::new(1, &[], &[]);
    for (slo, says) in [
        ("itl_99<=60ms", "did you mean itl_p99?"),
        ("itl_p99<=60", "not a positive duration"),
        ("itl_p99=60ms", "not METRIC<=DURATION"),
    ] {
        let (code, _, err) = f.fleet(&[
            "sweep",
            "--profile",
            "base",
            "--set",
            "server.mem_fraction_static=0.80..0.90",
            "--slo",
            slo,
        ]);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(says), "{slo}: {err}");
    }
    assert_eq!(f.busy_gpus(), 0, "nothing started");
}

#[test]
fn an_interrupted_search_resumes_without_running_a_finished_trial_again() {
    let _g = serial();
    let f = Fleet::new(2, &["mem_fraction_static: 0.85"], &[]);
    let mut args = vec!["--json", "sweep", "--profile", "base"];
    args.extend(search_args(&["--trials", "8"]));
    let sweep = f.spawn(&args);
    f.wait_trials(3);
    let (code, err) = sweep.interrupt();
    assert_eq!(code, Some(130), "{err}");
    assert!(f.records().is_empty(), "left running: {:?}", f.records());
    let file = f.file();
    let before = file["trials"].as_array().unwrap().clone();
    let proposed = file["search"]["proposed"].as_array().unwrap().clone();
    assert!(before.len() >= 3 && before.len() < 8, "{before:#?}");
    assert!(file["search"]["stopped"].is_null(), "{file:#}");
    let mut resumed = args.clone();
    resumed.push("--resume");
    let (code, _, err) = f.fleet(&resumed);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains(&format!("resuming: {} of", before.len())),
        "{err}"
    );
    let file = f.file();
    let trials = file["trials"].as_array().unwrap();
    let explored = trials
        .iter()
        .filter(|t| t["candidate"]["repeat"].is_null())
        .count();
    assert_eq!(explored, 8, "{}", summary(trials));
    // The finished trials stand as they were; no candidate ran twice (a confirmation window
    // is a candidate of its own); the search went on from its proposals.
    assert_eq!(trials[..before.len()], before[..]);
    let mut ids: Vec<&str> = trials
        .iter()
        .map(|t| t["candidate"]["id"].as_str().unwrap())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), trials.len(), "a trial ran again");
    let now = file["search"]["proposed"].as_array().unwrap();
    assert_eq!(now[..proposed.len()], proposed[..]);
    assert_eq!(file["search"]["stopped"], "trials");
    assert!(f.records().is_empty());
}
