//! The fake GPU: `<dir>/gpu<N>-<pid>.json` holds the memory this sim holds on GPU N and its
//! utilization, for a fake `nvidia-smi`; a server over several GPUs writes one per GPU. Written
//! atomically; removed on graceful exit. A reader ignores files whose pid is dead, so a
//! SIGKILLed sim's memory reads as released.

use std::path::{Path, PathBuf};

use serde::Serialize;

#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct GpuState {
    pub gpu: u32,
    pub pid: u32,
    pub port: u16,
    pub memory_used_mib: u64,
    pub memory_total_mib: u64,
    pub utilization_gpu: u32,
}

pub struct StateFile {
    path: PathBuf,
    tmp: PathBuf,
}

impl StateFile {
    pub fn new(dir: &Path, gpu: u32, pid: u32) -> StateFile {
        StateFile {
            path: dir.join(format!("gpu{gpu}-{pid}.json")),
            tmp: dir.join(format!(".gpu{gpu}-{pid}.json.tmp")),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes the state: temp file then rename, so readers never see a partial file.
    pub fn write(&self, state: &GpuState) -> std::io::Result<()> {
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let body = serde_json::to_vec(state).map_err(std::io::Error::other)?;
        std::fs::write(&self.tmp, body)?;
        std::fs::rename(&self.tmp, &self.path)
    }

    pub fn remove(&self) {
        // Already gone is fine: removal only has to leave no file behind.
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_file(&self.tmp);
    }
}

/// The state files of every GPU one process holds, each with the same memory (every rank of a
/// tensor-parallel group holds its equal share).
pub struct StateFiles {
    files: Vec<(u32, StateFile)>,
}

impl StateFiles {
    pub fn new(dir: &Path, gpus: &[u32], pid: u32) -> StateFiles {
        StateFiles {
            files: gpus
                .iter()
                .map(|&g| (g, StateFile::new(dir, g, pid)))
                .collect(),
        }
    }

    /// Writes `state` for each GPU (its `gpu` field set to that GPU); the first failure wins.
    pub fn write(&self, state: &GpuState) -> std::io::Result<()> {
        self.files.iter().try_for_each(|(gpu, file)| {
            file.write(&GpuState {
                gpu: *gpu,
                ..*state
            })
        })
    }

    /// Where the first file goes, for messages.
    pub fn path(&self) -> Option<&Path> {
        self.files.first().map(|(_, f)| f.path())
    }

    pub fn remove(&self) {
        for (_, f) in &self.files {
            f.remove();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_exactly_the_agreed_keys_and_removes() {
        let dir = tempfile::tempdir().unwrap();
        let f = StateFile::new(dir.path(), 3, 42);
        let s = GpuState {
            gpu: 3,
            pid: 42,
            port: 30003,
            memory_used_mib: 1000,
            memory_total_mib: 97887,
            utilization_gpu: 55,
        };
        f.write(&s).unwrap();
        let text = std::fs::read_to_string(dir.path().join("gpu3-42.json")).unwrap();
        assert_eq!(
            text,
            r#"{"gpu":3,"pid":42,"port":30003,"memory_used_mib":1000,"memory_total_mib":97887,"utilization_gpu":55}"#
        );
        f.remove();
        assert!(!f.path().exists());

        let all = StateFiles::new(dir.path(), &[5, 7], 42);
        all.write(&s).unwrap();
        let text = std::fs::read_to_string(dir.path().join("gpu7-42.json")).unwrap();
        assert!(text.starts_with(r#"{"gpu":7,"pid":42,"#), "{text}");
        assert!(dir.path().join("gpu5-42.json").exists());
        all.remove();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
