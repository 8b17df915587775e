//! Servers over several GPUs, through the real binary, real sshd and the fake `pct`, on an
//! 8-GPU PCIe board whose switch pairs are not numbered in order (0+2, 1+3, 4+6, 5+7; sockets
//! 0–3 and 4–7) and a simulated model too big for one GPU: TP2 groups are the switch pairs,
//! TP4 groups stay on a socket, a layout the host cannot hold is refused before anything
//! starts, and a tp that does not divide the model's heads fails with the server's own reason.

mod common;

use std::path::Path;

use common::world::World;
use serde_json::{Value, json};

struct Board {
    world: World,
    port_base: u16,
}

impl Board {
    fn new() -> Board {
        let topo = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/boards/pcie-8-unordered.txt")
            .display()
            .to_string();
        let world = World::with_env(1, &[("FAKE_NVIDIA_SMI_TOPO", &topo)]);
        world.inventory("all");
        Board {
            world,
            port_base: common::free_port_base(8),
        }
    }

    /// A sim profile of a 120 GiB model (one 96 GB GPU cannot hold it) with `server` lines and
    /// more sim flags.
    fn profile(&self, name: &str, server: &str, sim: &str) {
        let dir = self.world.home.path().join("profiles");
        std::fs::create_dir_all(&dir).unwrap();
        let yaml = format!(
            "model: /models/big\nlauncher: [{}]\nport_base: {}\nserver:\n{server}\
             \x20 extra_args: [--sim-weights-gib, \"120\"{sim}]\nenv:\n  SGLANG_SIM_STARTUP_SECS: \"1\"\n\
             \x20 SGLANG_SIM_TIME_SCALE: \"20\"\nhealth: {{startup_timeout: 60s, poll: 1s}}\n",
            common::local_fleet::SIM,
            self.port_base
        );
        std::fs::write(dir.join(format!("{name}.yaml")), yaml).unwrap();
    }

    fn fleet(&self, args: &[&str]) -> (i32, String, String) {
        let o = self.world.fleet(args).output().unwrap();
        (
            o.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    }

    fn json(&self, args: &[&str]) -> Value {
        let (code, out, err) = self.fleet(args);
        assert_eq!(code, 0, "fleet {args:?}:\n{out}\n{err}");
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"))
    }
}

impl Drop for Board {
    fn drop(&mut self) {
        let _ = self.fleet(&["down", "--grace", "5s"]);
    }
}

/// Each row's GPUs and slowest link, as `--json` gives them.
fn groups(rows: &Value) -> Vec<(Value, Value)> {
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| (r["group"]["gpus"].clone(), r["group"]["slowest"].clone()))
        .collect()
}

#[test]
fn groups_follow_the_board_and_impossible_layouts_are_refused_before_anything_starts() {
    let b = Board::new();

    // TP16 on 8 GPUs: refused before anything starts, naming what it needs and what exists.
    b.profile("tp16", "  tp_size: 16\n", "");
    let (code, out, err) = b.fleet(&["up", "--profile", "tp16"]);
    assert_eq!(code, 2, "a usage error:\n{out}\n{err}");
    assert!(
        err.contains("host `ct200`: a tp16 server needs 16 GPUs on each node, and the selection has 8 (0,1,2,3,4,5,6,7)"),
        "{err}"
    );
    assert_eq!(b.json(&["status", "--json"]), json!([]), "nothing started");

    // TP4: each group on one socket.
    b.profile("tp4", "  tp_size: 4\n", "");
    let plan = b.json(&["up", "--profile", "tp4", "--dry-run", "--json"]);
    assert_eq!(
        groups(&plan),
        [
            (json!([0, 1, 2, 3]), json!("NODE")),
            (json!([4, 5, 6, 7]), json!("NODE"))
        ]
    );

    // TP2: the switch pairs, started and shown as such by up and status.
    b.profile("tp2", "  tp_size: 2\n", "");
    let (code, up, err) = b.fleet(&["up", "--profile", "tp2"]);
    assert_eq!(code, 0, "{up}\n{err}");
    for pair in ["0+2 PIX", "1+3 PIX", "4+6 PIX", "5+7 PIX"] {
        assert!(up.contains(pair), "{pair} in\n{up}");
    }
    assert!(!err.contains("no GPU topology"), "{err}");
    let status = b.json(&["status", "--json"]);
    assert_eq!(
        groups(&status),
        [
            (json!([0, 2]), json!("PIX")),
            (json!([1, 3]), json!("PIX")),
            (json!([4, 6]), json!("PIX")),
            (json!([5, 7]), json!("PIX"))
        ],
        "{status:#}"
    );
    for row in status.as_array().unwrap() {
        assert_eq!(row["state"], "ready", "{row:#}");
        // Both GPUs of the group hold the server: the memory is the two GPUs' sum.
        let reading = &row["gpu_reading"];
        assert!(
            reading["memory_total_mib"].as_u64() > Some(150_000),
            "{reading:#}"
        );
    }
    let port = status[0]["port"].as_u64().unwrap();
    let addr = &b.world.hosts[0].address;
    let info = common::get_json(&format!("{addr}:{port}"), "/server_info");
    assert_eq!(info["tp_size"], 2, "{info:#}");
    let (code, _, err) = b.fleet(&["down"]);
    assert_eq!(code, 0, "{err}");

    // tp 4 on 8 GPUs of a model with 6 heads: the server's own words, from its log.
    b.profile(
        "tp4-heads",
        "  tp_size: 4\n",
        ", --sim-attention-heads, \"6\"",
    );
    let (code, out, err) = b.fleet(&["up", "--profile", "tp4-heads", "--gpus", "0,1,2,3"]);
    assert_eq!(code, 1, "the server failed:\n{out}\n{err}");
    assert!(
        err.contains(
            "Total number of attention heads (6) must be divisible by tensor parallel size (4)"
        ),
        "{err}"
    );
}

#[test]
fn the_sweep_crowns_the_best_layout_per_gpu_and_never_the_one_that_does_not_load() {
    let b = Board::new();
    b.profile("big", "", "");
    let out = b.world.home.path().join("sweep.json");
    let args = [
        "sweep",
        "--profile",
        "big",
        "--set",
        "server.tp_size=1,2,4,8",
        "--input-len",
        "32",
        "--output-len",
        "64",
        "--warmup",
        "2s",
        "--duration",
        "6s",
        "--json",
        "--out",
        out.to_str().unwrap(),
    ];
    let started = std::time::Instant::now();
    let (code, text, err) = b.fleet(&args);
    let wall = started.elapsed().as_secs_f64();
    let r: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}\n{err}"));
    // TP1 failing is the sweep's finding: the command says so in its exit code.
    assert!(code == 0 || code == 1, "{err}");
    let rows = r["rows"].as_array().unwrap();
    let row = |tp: u32| {
        rows.iter()
            .find(|r| r["label"] == format!("tp_size={tp}"))
            .unwrap_or_else(|| panic!("no row tp_size={tp}: {r:#}"))
    };
    // TP1 does not load (120 GiB on a 96 GB GPU), says why, and is never crowned.
    let tp1 = &row(1)["trial"]["outcome"];
    assert_eq!(tp1["state"], "failed", "{tp1:#}");
    assert_eq!(tp1["kind"], "not_enough_memory", "{tp1:#}");
    assert!(!row(1)["winner"].as_bool().unwrap_or(false), "{r:#}");
    let per_gpu = |tp: u32| {
        row(tp)["trial"]["outcome"]["output_tok_s_per_gpu"]
            .as_f64()
            .unwrap()
    };
    // Compared per GPU: the winner is the best of those that ran (how links rank the layouts is
    // the sim's unit tests' to hold, at fixed time; here the windows are seconds long).
    let winner = r["winner"].as_str().unwrap();
    assert_ne!(winner, "tp_size=1");
    let best = [2, 4, 8].map(per_gpu).into_iter().fold(0.0, f64::max);
    assert_eq!(per_gpu(winner[8..].parse().unwrap()), best, "{r:#}");

    // The four layouts take two rounds: TP8 alone, then TP4, TP2 and TP1 side by side on the
    // GPUs it freed (wall time against one candidate is the layout benchmark's to judge).
    let rounds: Vec<&str> = err.lines().filter(|l| l.contains("starting ")).collect();
    assert_eq!(rounds.len(), 2, "{err}");
    assert!(
        rounds[0].contains("starting tp_size=8 on 1 servers"),
        "{err}"
    );
    eprintln!("sweep of 4 layouts: {wall:.1} s");
    // `/models/big` is no directory here: no prediction, said once.
    assert_eq!(
        err.matches(
            "no memory prediction: `/models/big` is no directory with a config.json on ct200"
        )
        .count(),
        1,
        "{err}"
    );
}

/// A dense 120 GiB model on disk as a real one is (`config.json` and sparse weight files): the
/// sweep reads both before anything starts, skips TP1 (its weights outgrow the static pool)
/// with the numbers, and shows TP2's predicted cap and KV pool beside what its server reported.
#[test]
fn a_layout_predicted_not_to_fit_is_skipped_and_the_others_prediction_is_held_to_the_server() {
    let b = Board::new();
    // Where the host (its container, with its own /tmp) finds it.
    let at = "/tmp/models/dense-120g";
    let model = b.world.container_path(0, at);
    std::fs::create_dir_all(&model).unwrap();
    std::fs::write(
        model.join("config.json"),
        r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 8192,
            "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
            "torch_dtype": "bfloat16", "max_position_embeddings": 32768}"#,
    )
    .unwrap();
    for i in 1..=4 {
        let f = std::fs::File::create(model.join(format!("model-0000{i}-of-00004.safetensors")))
            .unwrap();
        f.set_len(30 << 30).unwrap();
    }
    let dir = b.world.home.path().join("profiles");
    std::fs::create_dir_all(&dir).unwrap();
    // A request cap keeps the load small; the KV pool is the model's own.
    let yaml = format!(
        "model: {}\nlauncher: [{}]\nport_base: {}\nserver:\n  mem_fraction_static: 0.85\n\
         \x20 max_running_requests: 48\nenv:\n  SGLANG_SIM_STARTUP_SECS: \"1\"\n\
         \x20 SGLANG_SIM_TIME_SCALE: \"20\"\nhealth: {{startup_timeout: 60s, poll: 1s}}\n",
        at,
        common::local_fleet::SIM,
        b.port_base
    );
    std::fs::write(dir.join("dense.yaml"), yaml).unwrap();
    let out = b.world.home.path().join("sweep.json");
    // The sweep, then the same sweep `--resume`d from its file, with `more` flags.
    let sweep = |more: &[&str]| {
        let mut args = vec![
            "sweep",
            "--profile",
            "dense",
            "--set",
            "server.tp_size=1,2",
            "--input-len",
            "32",
            "--output-len",
            "32",
            "--warmup",
            "1s",
            "--duration",
            "3s",
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(more);
        b.fleet(&args)
    };
    let (code, text, err) = sweep(&["--json"]);
    // Skipping a layout that cannot fit is no failure of the sweep.
    assert_eq!(code, 0, "{text}\n{err}");
    let r: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}\n{err}"));
    let rows = r["rows"].as_array().unwrap();
    let row = |label: &str| rows.iter().find(|r| r["label"] == label).unwrap();
    let tp1 = &row("tp_size=1")["trial"]["outcome"];
    assert_eq!(tp1["kind"], "predicted", "{tp1:#}\n{err}");
    assert_eq!(
        tp1["reason"],
        "predicted not to fit: tp1: weights 120.0 GiB per GPU, the static pool holds 81.3 GiB \
         of 95.6 GiB at mem_fraction_static 0.85",
        "{tp1:#}"
    );
    assert!(
        !err.lines()
            .any(|l| l.contains("starting") && l.contains("tp_size=1")),
        "TP1 never started:\n{err}"
    );
    assert_eq!(r["winner"], "tp_size=2", "{r:#}");
    // TP2: 60 GiB of weights per GPU, 21,764 MiB beside them at 160 KiB a token (4 of the 8 KV
    // heads of 80 layers × 128 × bf16 × K and V) = 139,289 tokens; the cap is the one asked for.
    let check = &r["predictions"][0];
    assert_eq!(check["label"], "tp_size=2", "{r:#}");
    assert_eq!(check["weights_gib_per_gpu"], 60.0, "{check:#}");
    assert_eq!(check["predicted_kv_tokens"], 139_289, "{check:#}");
    assert_eq!(check["measured_kv_tokens"], 139_289, "{check:#}");
    assert_eq!(check["predicted_cap"], 48, "{check:#}");
    assert_eq!(check["measured_cap"], 48, "{check:#}");
    assert_eq!(check["cap_error_pct"], 0.0, "{check:#}");
    assert_eq!(check["kv_error_pct"], 0.0, "{check:#}");

    // The text report, from the finished sweep on file: the skip and the prediction's error.
    let (code, text, err) = sweep(&["--resume"]);
    assert_eq!(code, 0, "{text}\n{err}");
    assert!(!err.contains("starting"), "nothing runs again:\n{err}");
    assert!(
        text.contains("skipped: tp_size=1: predicted not to fit: tp1: weights 120.0 GiB per GPU"),
        "{text}"
    );
    let line = text
        .lines()
        .skip_while(|l| !l.starts_with("memory predicted before the start"))
        .find(|l| l.contains("tp_size=2") && l.contains("139289"))
        .unwrap_or_else(|| panic!("no prediction row in\n{text}"));
    assert!(line.contains("+0.0%"), "{line}");

    // The page, as a browser builds it: the skipped layout is shown skipped, with its numbers,
    // and not as a failure.
    let html = b.world.home.path().join("report.html");
    let (code, text, err) = b.fleet(&[
        "report",
        out.to_str().unwrap(),
        "-o",
        html.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{text}\n{err}");
    let dom = common::chromium::rendered_dom(&b.world.home.path().join("chromium"), &html);
    let row = |table: &str| {
        let t = &dom[dom
            .find(&format!("id=\"{table}\""))
            .unwrap_or_else(|| panic!("no {table}"))..];
        t[..t.find("</table>").unwrap()].to_string()
    };
    let sweep = row("sweep-table");
    let tp1 = &sweep[sweep
        .find("<td>tp_size=1</td>")
        .unwrap_or_else(|| panic!("{sweep}"))..];
    assert!(
        tp1.starts_with("<td>tp_size=1</td><td>skipped</td>"),
        "{tp1}"
    );
    assert!(
        row("skipped-candidates").contains("weights 120.0 GiB per GPU"),
        "the reason, with its numbers"
    );
    assert!(!dom.contains("id=\"failed-candidates\""), "nothing failed");
    assert!(
        dom.contains("class=\"skipped\""),
        "the bar is drawn as skipped"
    );
}
