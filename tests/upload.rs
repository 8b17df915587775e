//! `fleet generate --upload` through the real binary against real `sglang-sim` servers: shards
//! in a `file://` directory and in an S3 bucket served by `moto_server`, byte for byte; a
//! resume after Ctrl-C that uploads nothing twice; a missing bucket reported with exit 3 (the upload failed).

mod generate_common;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use generate_common::*;
use serde_json::json;

fn generate(out: &Path, prompts: &Path, url: &str, dest: &str) -> Command {
    let mut c = fleet();
    c.arg("generate")
        .arg("--prompts")
        .arg(prompts)
        .arg("--out")
        .arg(out)
        .args(["--url", url, "--max-tokens", "16", "--upload", dest]);
    c
}

fn fast_sim() -> Sim {
    Sim::start(&[
        "--mamba-radix-cache-strategy",
        "no_buffer",
        "--disable-overlap-schedule",
        "--sim-time-scale",
        "500",
    ])
}

/// The completion shards of `dir` by file name, with their bytes.
fn local_shards(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?.to_string();
            name.starts_with("completions-")
                .then(|| (name, std::fs::read(&p).unwrap()))
        })
        .collect()
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn a_file_destination_receives_every_shard_byte_for_byte() {
    let sim = fast_sim();
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("prompts.jsonl");
    write_prompts(&prompts, 300);
    let out = tmp.path().join("out");
    let dest = tmp.path().join("bucket/runs/today");
    let o = generate(
        &out,
        &prompts,
        &sim.url,
        &format!("file://{}", dest.display()),
    )
    .args(["--shard-lines", "100"])
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_exactly_once(&out, 300);
    let local = local_shards(&out);
    assert_eq!(local.len(), 3, "{:?}", local.keys());
    // Nothing else lands in the destination (no staging files left behind).
    assert_eq!(local_shards(&dest), local);
    assert_eq!(std::fs::read_dir(&dest).unwrap().count(), 3);
    let bytes: usize = local.values().map(Vec::len).sum();
    let p = progress(&out);
    assert_eq!(
        (p["s3_uploaded"].as_u64(), p["s3_bytes"].as_u64()),
        (Some(3), Some(bytes as u64))
    );
    assert_eq!(p["status"], "done");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains(&format!("uploaded: 3 shards, {bytes} bytes")),
        "{stdout}"
    );
}

#[test]
fn a_resume_after_ctrl_c_uploads_the_rest_and_nothing_twice() {
    // About 40 completions a second: a shard finishes every second or so.
    let sim = Sim::start(&[
        "--mamba-radix-cache-strategy",
        "no_buffer",
        "--disable-overlap-schedule",
        "--sim-time-scale",
        "20",
    ]);
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("prompts.jsonl");
    write_prompts(&prompts, 400);
    let out = tmp.path().join("out");
    let dest = tmp.path().join("dest");
    let spec = format!("file://{}", dest.display());
    let run = |resume: bool| {
        let mut c = generate(&out, &prompts, &sim.url, &spec);
        c.args(["--shard-lines", "40", "--concurrency", "1", "--grace", "2s"]);
        if resume {
            c.arg("--resume");
        }
        c
    };

    let child = run(false)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let second = dest.join("completions-00001.jsonl");
    let t0 = Instant::now();
    while !second.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no second shard was uploaded"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(130), "{}", stderr(&o));
    let first_run = stderr(&o);
    let done = completions(&out).len();
    assert!(done < 400, "the run finished before Ctrl-C: {first_run}");
    // The shard that Ctrl-C finished is left for the resume, and the user is told so.
    assert!(first_run.contains("not uploaded"), "{first_run}");
    let uploaded_before: BTreeMap<String, (u64, i64)> = std::fs::read_dir(&dest)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            (
                e.file_name().into_string().unwrap(),
                (m.ino(), m.mtime_nsec()),
            )
        })
        .collect();
    assert!(uploaded_before.len() >= 2);
    assert!(uploaded_before.len() < local_shards(&out).len());

    let o = run(true).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let resumed = stderr(&o);
    assert_exactly_once(&out, 400);
    let local = local_shards(&out);
    assert_eq!(local_shards(&dest), local);
    for (name, (ino, mtime)) in &uploaded_before {
        assert!(
            resumed.contains(&format!("{name} is already uploaded")),
            "{resumed}"
        );
        assert!(
            !resumed.contains(&format!("uploaded {name}:")),
            "{name} went twice: {resumed}"
        );
        let m = std::fs::metadata(dest.join(name)).unwrap();
        assert_eq!(
            (m.ino(), m.mtime_nsec()),
            (*ino, *mtime),
            "{name} rewritten"
        );
    }
    let p = progress(&out);
    assert_eq!(p["s3_uploaded"].as_u64(), Some(local.len() as u64));
    assert_eq!(
        p["s3_bytes"].as_u64(),
        Some(local.values().map(|v| v.len() as u64).sum())
    );
}

/// A `moto_server` (S3 stand-in) on a free loopback port, killed when dropped.
struct Moto {
    child: Child,
    endpoint: String,
}

impl Moto {
    fn start() -> Moto {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run moto_server ({e}): install it with `pip install 'moto[server]'` \
                     (scripts/test does)"
                )
            });
        let mut moto = Moto {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
        };
        let t0 = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(st) = moto.child.try_wait().unwrap() {
                panic!("moto_server exited ({st}) before listening");
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "moto_server not up");
            std::thread::sleep(Duration::from_millis(50));
        }
        moto
    }

    fn aws_env(&self, c: &mut Command) {
        for (k, _) in std::env::vars() {
            if k.starts_with("AWS_") {
                c.env_remove(k);
            }
        }
        c.env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ENDPOINT_URL", &self.endpoint)
            .env("AWS_ALLOW_HTTP", "true");
    }

    /// Runs a boto3 snippet (boto3 comes with moto) with `s3`, a client for this server.
    fn boto3(&self, script: &str) {
        let mut c = Command::new("python3");
        self.aws_env(&mut c);
        let o = c
            .arg("-c")
            .arg(format!(
                "import boto3, os, sys\n\
                 s3 = boto3.client('s3', endpoint_url=os.environ['AWS_ENDPOINT_URL'])\n{script}"
            ))
            .output()
            .unwrap();
        assert!(o.status.success(), "boto3: {}", stderr(&o));
    }

    /// Downloads every object under `prefix` of `bucket` into `into`, by base name.
    fn download(&self, bucket: &str, prefix: &str, into: &Path) -> BTreeMap<String, Vec<u8>> {
        std::fs::create_dir_all(into).unwrap();
        self.boto3(&format!(
            "for o in s3.list_objects_v2(Bucket={bucket:?}, Prefix={prefix:?}).get('Contents', []):\n\
             \x20   s3.download_file({bucket:?}, o['Key'], os.path.join({dir:?}, o['Key'].rsplit('/', 1)[-1]))\n",
            dir = into.display().to_string()
        ));
        std::fs::read_dir(into)
            .unwrap()
            .map(|e| {
                let p: PathBuf = e.unwrap().path();
                (
                    p.file_name().unwrap().to_str().unwrap().to_string(),
                    std::fs::read(&p).unwrap(),
                )
            })
            .collect()
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn an_s3_bucket_receives_every_shard_including_a_multipart_one() {
    let moto = Moto::start();
    moto.boto3("s3.create_bucket(Bucket='fleet-out')");
    let sim = fast_sim();
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("prompts.jsonl");
    write_prompts(&prompts, 300);
    let out = tmp.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    // An earlier run without --upload left a 12 MB shard: a multipart upload of 5 MiB parts.
    let long = "word ".repeat(24_000);
    write_lines(
        &out.join("completions-00000.jsonl"),
        &(0..100)
            .map(|i| {
                json!({"id": format!("p{i}"), "output": long, "prompt_tokens": 3,
                    "completion_tokens": 24_000, "finish_reason": "length",
                    "instance": "earlier", "latency_s": 1.0})
                .to_string()
            })
            .collect::<Vec<_>>(),
    );
    let mut c = generate(&out, &prompts, &sim.url, "s3://fleet-out/runs/today/");
    moto.aws_env(&mut c);
    let o = c
        .args(["--resume", "--shard-lines", "150"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_exactly_once(&out, 300);
    let local = local_shards(&out);
    assert_eq!(local.len(), 3, "{:?}", local.keys());
    assert!(local["completions-00000.jsonl"].len() > 2 * 5 * 1024 * 1024);
    let remote = moto.download("fleet-out", "runs/today/", &tmp.path().join("got"));
    assert_eq!(
        remote.keys().collect::<Vec<_>>(),
        local.keys().collect::<Vec<_>>()
    );
    assert!(remote == local, "objects differ from the local shards");
    let p = progress(&out);
    assert_eq!(p["s3_uploaded"].as_u64(), Some(3));
    assert_eq!(
        p["s3_bytes"].as_u64(),
        Some(local.values().map(|v| v.len() as u64).sum())
    );
}

#[test]
fn a_missing_bucket_is_reported_the_output_stays_and_the_exit_is_3() {
    let moto = Moto::start();
    let sim = fast_sim();
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("prompts.jsonl");
    write_prompts(&prompts, 50);
    let out = tmp.path().join("out");
    let mut c = generate(&out, &prompts, &sim.url, "s3://no-such-bucket/x");
    moto.aws_env(&mut c);
    let o = c.output().unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        err.contains("1 shards are not uploaded to s3://no-such-bucket/x"),
        "{err}"
    );
    assert!(
        err.contains("completions-00000.jsonl: s3://no-such-bucket/x/completions-00000.jsonl"),
        "{err}"
    );
    assert!(err.contains("NoSuchBucket"), "{err}");
    assert!(err.contains("--resume"), "{err}");
    assert_exactly_once(&out, 50);
    let p = progress(&out);
    assert_eq!(
        (p["s3_uploaded"].as_u64(), p["status"].as_str()),
        (Some(0), Some("failed"))
    );
}

#[test]
fn a_destination_fleet_cannot_write_to_is_a_usage_error() {
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("prompts.jsonl");
    write_prompts(&prompts, 1);
    for (dest, why) in [
        ("gs://bucket/x", "unknown scheme"),
        ("file://relative/dir", "absolute path"),
        ("s3:///prefix", "no bucket name"),
    ] {
        let o = generate(
            &tmp.path().join("out"),
            &prompts,
            "http://127.0.0.1:9",
            dest,
        )
        .output()
        .unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{dest}: {err}");
        assert!(err.contains(dest) && err.contains(why), "{err}");
        assert!(err.contains("s3://BUCKET/PREFIX"), "{err}");
    }
}
