//! Reading, on a host, what the memory prediction needs of a model (`layout::predict`): its
//! `config.json` and the bytes of its `*.safetensors` files, through the host's transport.

use crate::layout::predict::{Model, ModelError};
use crate::remote::{RemoteError, Transport};

/// Prints `config.json`, a marker line, then each weight file's size. The model path comes in
/// as `$1`, never inside the script, so no path can change what the shell runs. Exit 3: no
/// such directory or no `config.json` there (a hub id, downloaded by the server itself).
const SCRIPT: &str = r#"cd -- "$1" 2>/dev/null && [ -f config.json ] || exit 3
cat config.json
printf '\n%s\n' "$2"
for f in *.safetensors; do [ -f "$f" ] && wc -c < "$f"; done
exit 0"#;

const MARKER: &str = "--fleet-weight-bytes--";

#[derive(Debug, thiserror::Error)]
pub enum ModelFactsError {
    #[error("`{path}` is no directory with a config.json on {host}")]
    NotHere { host: String, path: String },
    #[error("{host}: {path}/config.json: {source}")]
    Config {
        host: String,
        path: String,
        source: ModelError,
    },
    #[error("{host}: {path} holds no *.safetensors weights")]
    NoWeights { host: String, path: String },
    #[error("{host}: reading {path} failed: {stderr}")]
    Failed {
        host: String,
        path: String,
        stderr: String,
    },
    #[error(transparent)]
    Remote(#[from] RemoteError),
}

/// The model at `path` on `t`'s host.
pub async fn read(t: &dyn Transport, path: &str) -> Result<Model, ModelFactsError> {
    let argv = ["sh", "-c", SCRIPT, "sh", path, MARKER].map(str::to_string);
    let out = t.run(&argv).await?;
    let (host, path) = (t.host().to_string(), path.to_string());
    match out.status {
        Some(0) => {}
        Some(3) => return Err(ModelFactsError::NotHere { host, path }),
        _ => {
            return Err(ModelFactsError::Failed {
                host,
                path,
                stderr: out.stderr_lossy().trim().to_string(),
            });
        }
    }
    parse(&out.stdout_lossy()).map_err(|e| match e {
        None => ModelFactsError::NoWeights {
            host: host.clone(),
            path: path.clone(),
        },
        Some(source) => ModelFactsError::Config { host, path, source },
    })
}

/// The script's output as a model; `Err(None)` when it lists no weights.
fn parse(text: &str) -> Result<Model, Option<ModelError>> {
    let (config, sizes) = text
        .rsplit_once(MARKER)
        .ok_or(Some(ModelError::Json("no output".into())))?;
    let sizes: Vec<u64> = sizes
        .split_whitespace()
        .filter_map(|s| s.parse().ok())
        .collect();
    if sizes.is_empty() {
        return Err(None);
    }
    Model::from_config(config, sizes.iter().sum()).map_err(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_and_the_weight_files_sizes_make_the_model() {
        let out = format!(
            "{{\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"hidden_size\": 64}}\n\n\
             {MARKER}\n100\n 23\n"
        );
        let m = parse(&out).unwrap();
        assert_eq!((m.weight_bytes, m.head_dim), (123, 16));
        assert_eq!(parse(&format!("{{}}\n{MARKER}\n")).unwrap_err(), None);
    }

    #[tokio::test]
    async fn a_path_with_shell_characters_is_read_as_a_path() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("a model; $(touch pwned) 'x'");
        std::fs::create_dir(&model).unwrap();
        std::fs::write(
            model.join("config.json"),
            r#"{"num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 16}"#,
        )
        .unwrap();
        let weights = std::fs::File::create(model.join("model-00001.safetensors")).unwrap();
        // Sparse: the size is what counts, not what is written.
        weights.set_len(3 << 30).unwrap();
        let t = crate::remote::LocalTransport::new("local");
        let m = read(&t, model.to_str().unwrap()).await.unwrap();
        assert_eq!(m.weight_bytes, 3 << 30);
        assert!(!dir.path().join("pwned").exists());
        let missing = read(&t, "Qwen/Qwen3-8B").await.unwrap_err();
        assert!(
            matches!(missing, ModelFactsError::NotHere { .. }),
            "{missing}"
        );
    }
}
