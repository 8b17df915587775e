//! The real SGLang 0.5.23 server on the CPU, as the tests run it: the venv and tiny model that
//! `scripts/real-sglang-env` installed into the test cache, the stand-in `sgl_kernel`
//! (`tests/fixtures/real_sglang`), the flags and environment of SGLang's CPU path, and a profile
//! that launches it through fleet.

use std::path::{Path, PathBuf};

/// Flags the CPU path needs (see the real-SGLang section of the README): `--device cpu` with
/// `SGLANG_USE_CPU_ENGINE=1` (`is_cpu()` in `srt/utils/common.py` wants both), torch's attention
/// (x86 defaults to intel_amx), no CUDA graphs, a 16,384-token KV pool (the default takes 10 GB
/// of RAM and 31 s), and a scheduler that sleeps when idle instead of spinning a core.
pub const CPU_ARGS: &[&str] = &[
    "--device",
    "cpu",
    "--disable-cuda-graph",
    "--max-total-tokens",
    "16384",
    "--sleep-on-idle",
];

/// The tiny model's context length (`make_model.py`): prompts of more tokens are too long.
pub const CONTEXT: u64 = 512;

/// Reads `{"url","body"}` lines and validates each body with the SDK's own pydantic models.
const VALIDATE_BODIES: &str = r#"
import json, sys
from openai.types.chat import ChatCompletion
from openai.types import Completion
n = {"chat": 0, "completions": 0}
for raw in open(sys.argv[1]):
    rec = json.loads(raw)
    if rec["url"] == "/v1/chat/completions":
        c = ChatCompletion.model_validate(rec["body"])
        assert c.object == "chat.completion" and c.choices[0].message.role == "assistant", c
        assert c.usage is not None and c.usage.completion_tokens > 0, c
        n["chat"] += 1
    else:
        c = Completion.model_validate(rec["body"])
        assert c.object == "text_completion" and isinstance(c.choices[0].text, str), c
        assert c.usage is not None and c.usage.completion_tokens > 0, c
        n["completions"] += 1
print(json.dumps(n))
"#;

pub struct RealSglang {
    /// `<venv>/bin/python`.
    pub python: PathBuf,
    /// The installed wheel's `sgl_kernel`, whose pure-Python submodules the stand-in serves.
    pub wheel_sgl_kernel: PathBuf,
    /// The tiny random-weight Llama.
    pub model: PathBuf,
}

impl RealSglang {
    /// Where `scripts/real-sglang-env` put it (`FLEET_TEST_CACHE`, default `~/.cache/fleet-test`);
    /// panics with the command that installs it when it is missing.
    pub fn find() -> RealSglang {
        let cache = std::env::var_os("FLEET_TEST_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/fleet-test")
            });
        let venv = cache.join("sglang-0.5.23");
        let model = cache.join("tiny-llama");
        assert!(
            venv.join(".fleet-ready").exists() && model.join(".fleet-ready").exists(),
            "the real SGLang 0.5.23 and its tiny test model are not installed under {}: run \
             scripts/real-sglang-env (the README's test command, scripts/test, runs it first)",
            cache.display()
        );
        let lib = std::fs::read_dir(venv.join("lib"))
            .expect("the venv's lib/")
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .find(|p| p.join("site-packages/sglang").is_dir())
            .expect("site-packages with sglang in the venv");
        RealSglang {
            python: venv.join("bin/python"),
            wheel_sgl_kernel: lib.join("site-packages/sgl_kernel"),
            model: std::fs::canonicalize(model).expect("the tiny model"),
        }
    }

    /// Pids of every process with `calls` (a test's stand-in log) in its environment: the
    /// launchers, schedulers and detokenizers of that test's servers, and nothing else.
    pub fn processes(calls: &Path) -> Vec<u32> {
        let needle = format!("FLEET_SGL_KERNEL_CALLS={}", calls.display());
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/environ"))
                    .map(|env| env.split(|b| *b == 0).any(|var| var == needle.as_bytes()))
                    .unwrap_or(false)
            })
            .collect()
    }

    /// `tests/fixtures/real_sglang`, which holds the stand-in `sgl_kernel` package.
    pub fn stand_in_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/real_sglang")
    }

    /// The environment of SGLang's CPU path with the stand-in `sgl_kernel` first on the import
    /// path; every call of a stand-in op is logged to `calls` (see [`RealSglang::stub_calls`]).
    pub fn env(&self, calls: &Path) -> Vec<(String, String)> {
        vec![
            ("SGLANG_USE_CPU_ENGINE".into(), "1".into()),
            ("HF_HUB_OFFLINE".into(), "1".into()),
            (
                "PYTHONPATH".into(),
                Self::stand_in_dir().display().to_string(),
            ),
            (
                "FLEET_SGL_KERNEL_WHEEL_DIR".into(),
                self.wheel_sgl_kernel.display().to_string(),
            ),
            ("FLEET_SGL_KERNEL_CALLS".into(), calls.display().to_string()),
        ]
    }

    /// A fleet profile that launches the real server on the CPU: `server` lines go under
    /// `server:`, after the CPU flags.
    pub fn profile(&self, port_base: u16, calls: &Path, server: &[&str]) -> String {
        let extra: Vec<String> = CPU_ARGS.iter().map(|a| format!("\"{a}\"")).collect();
        let env: String = self
            .env(calls)
            .iter()
            .map(|(k, v)| format!("  {k}: \"{v}\"\n"))
            .collect();
        let server: String = server.iter().map(|l| format!("  {l}\n")).collect();
        format!(
            "model: {}\nserved_model_name: tiny\nlauncher: [{}, -m, sglang.launch_server]\n\
             port_base: {port_base}\nserver:\n  attention_backend: torch_native\n  \
             extra_args: [{}]\n{server}env:\n{env}health:\n  startup_timeout: 15m\n  poll: 200ms\n",
            self.model.display(),
            self.python.display(),
            extra.join(", "),
        )
    }

    /// Validates each `(url, body)` with the official `openai` SDK of the venv (sglang depends
    /// on it): `ChatCompletion.model_validate` for `/v1/chat/completions`, else
    /// `Completion.model_validate`. Panics with the SDK's error on a body it refuses; returns how
    /// many chat and completions bodies it validated.
    pub fn validate_openai_bodies(&self, bodies: &[(String, serde_json::Value)]) -> (u64, u64) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("bodies.jsonl");
        let text: String = bodies
            .iter()
            .map(|(url, body)| format!("{}\n", serde_json::json!({"url": url, "body": body})))
            .collect();
        std::fs::write(&file, text).unwrap();
        let o = std::process::Command::new(&self.python)
            .arg("-c")
            .arg(VALIDATE_BODIES)
            .arg(&file)
            .output()
            .expect("the venv's python");
        assert!(
            o.status.success(),
            "the openai SDK refused a body:\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let n: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        (
            n["chat"].as_u64().unwrap(),
            n["completions"].as_u64().unwrap(),
        )
    }

    /// The stand-in ops that were called (one line each: pid and name); none is ever expected.
    pub fn stub_calls(calls: &Path) -> String {
        std::fs::read_to_string(calls).unwrap_or_default()
    }
}
