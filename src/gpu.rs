//! GPU readings behind one trait: NVML on this machine, `nvidia-smi` CSV over a transport on
//! remote hosts (and locally when NVML cannot be loaded).

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use serde::Serialize;

use crate::remote::{RemoteError, Transport};

/// The fields fleet asks `nvidia-smi` for, in this order.
pub const NVIDIA_SMI_QUERY: &str = "index,uuid,name,memory.total,memory.used,memory.free,utilization.gpu,temperature.gpu,power.draw";

/// One GPU as seen at one moment. Readings a driver does not support are `None`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuReading {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_total_mib: u64,
    pub memory_used_mib: u64,
    pub memory_free_mib: u64,
    pub utilization_pct: Option<u32>,
    pub temperature_c: Option<u32>,
    pub power_w: Option<f64>,
}

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error(
        "{host}: no NVIDIA driver found: NVML could not be loaded ({nvml}) and `nvidia-smi` is not on PATH (is the driver installed, and are the GPUs passed into this machine or container?)"
    )]
    NoDriver { host: String, nvml: String },
    #[error(
        "{host}: `nvidia-smi` is not on PATH there (install the NVIDIA driver utilities, or pass the GPUs into the container)"
    )]
    NoNvidiaSmi { host: String },
    #[error("{host}: `nvidia-smi` failed with exit status {status}: {message}")]
    NvidiaSmiFailed {
        host: String,
        status: String,
        message: String,
    },
    #[error("{host}: cannot read `nvidia-smi` output line {line}: {message}: {text:?}")]
    Parse {
        host: String,
        line: usize,
        message: String,
        text: String,
    },
    #[error("{host}: NVML: {message}")]
    Nvml { host: String, message: String },
    #[error(
        "{host}: a Slurm host's GPUs are given by Slurm to each step; fleet reads no GPU memory \
         there (`fleet status` shows the GPU each server got)"
    )]
    Slurm { host: String },
    #[error("{host}: cannot read `nvidia-smi topo -m`: {source}")]
    Topology {
        host: String,
        source: crate::layout::TopologyError,
    },
    #[error(transparent)]
    Remote(#[from] RemoteError),
}

/// Reads the host's board with `nvidia-smi topo -m` over a transport (NVML has no one call
/// for the whole matrix, and the text is what a user would check by hand).
pub async fn read_board(t: &dyn Transport) -> Result<crate::layout::Board, GpuError> {
    let host = t.host().to_string();
    let argv = [
        "nvidia-smi".to_string(),
        "topo".to_string(),
        "-m".to_string(),
    ];
    let out = match t.run(&argv).await {
        Err(RemoteError::Spawn { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Err(GpuError::NoNvidiaSmi { host });
        }
        other => other?,
    };
    if !out.success() {
        let message = first_line(&out.stderr_lossy())
            .or_else(|| first_line(&out.stdout_lossy()))
            .unwrap_or_else(|| "no output".into());
        return Err(GpuError::NvidiaSmiFailed {
            host,
            status: out
                .status
                .map_or("unknown (killed?)".into(), |s| s.to_string()),
            message,
        });
    }
    crate::layout::Board::parse(&out.stdout_lossy())
        .map_err(|source| GpuError::Topology { host, source })
}

/// A source of GPU readings for one host.
#[async_trait]
pub trait GpuProbe: Send + Sync {
    async fn read(&self) -> Result<Vec<GpuReading>, GpuError>;
}

/// Reads GPUs with `nvidia-smi --query-gpu=... --format=csv,noheader,nounits` over a transport.
pub struct NvidiaSmi {
    pub transport: Arc<dyn Transport>,
}

#[async_trait]
impl GpuProbe for NvidiaSmi {
    async fn read(&self) -> Result<Vec<GpuReading>, GpuError> {
        let host = self.transport.host().to_string();
        let text = nvidia_smi(
            self.transport.as_ref(),
            &format!("--query-gpu={NVIDIA_SMI_QUERY}"),
        )
        .await?;
        parse_nvidia_smi_csv(&text).map_err(|(line, message, text)| GpuError::Parse {
            host,
            line,
            message,
            text,
        })
    }
}

/// A process using a GPU's memory, as `nvidia-smi --query-compute-apps` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuProcess {
    pub gpu: u32,
    pub pid: u32,
    pub used_mib: u64,
    pub name: String,
}

/// The processes using each GPU, from `nvidia-smi --query-compute-apps` (which names the GPU by
/// uuid) and the GPUs' indices by uuid.
pub async fn read_processes(t: &dyn Transport) -> Result<Vec<GpuProcess>, GpuError> {
    let (gpus, apps) = tokio::try_join!(
        nvidia_smi(t, "--query-gpu=index,uuid"),
        nvidia_smi(
            t,
            "--query-compute-apps=pid,gpu_uuid,used_memory,process_name"
        ),
    )?;
    parse_processes(&gpus, &apps).map_err(|(line, message, text)| GpuError::Parse {
        host: t.host().to_string(),
        line,
        message,
        text,
    })
}

/// Parses the two CSVs [`read_processes`] reads. A process name may hold commas, so it comes
/// last and keeps them.
fn parse_processes(gpus: &str, apps: &str) -> Result<Vec<GpuProcess>, (usize, String, String)> {
    let bad = |i: usize, what: &str, line: &str| (i + 1, what.to_string(), line.to_string());
    let mut index = std::collections::BTreeMap::new();
    for (i, line) in gpus
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let (n, uuid) = line
            .split_once(',')
            .ok_or_else(|| bad(i, "expected index, uuid", line))?;
        let n: u32 = n.trim().parse().map_err(|_| bad(i, "a GPU index", line))?;
        index.insert(uuid.trim().to_string(), n);
    }
    let mut out = Vec::new();
    for (i, line) in apps
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let f: Vec<&str> = line.splitn(4, ',').map(str::trim).collect();
        let [pid, uuid, used, name] = f[..] else {
            return Err(bad(
                i,
                "expected pid, gpu_uuid, used_memory, process_name",
                line,
            ));
        };
        let Some(&gpu) = index.get(uuid) else {
            return Err(bad(i, "a GPU uuid that --query-gpu did not list", line));
        };
        out.push(GpuProcess {
            gpu,
            pid: pid.parse().map_err(|_| bad(i, "a pid", line))?,
            // `[N/A]` where the driver cannot say (some containers): nothing known in use.
            used_mib: used.parse().unwrap_or(0),
            name: name.to_string(),
        });
    }
    Ok(out)
}

/// Runs `nvidia-smi QUERY --format=csv,noheader,nounits` through `t`, its output or why not.
async fn nvidia_smi(t: &dyn Transport, query: &str) -> Result<String, GpuError> {
    let host = t.host().to_string();
    let argv = [
        "nvidia-smi".to_string(),
        query.to_string(),
        "--format=csv,noheader,nounits".to_string(),
    ];
    let out = match t.run(&argv).await {
        Err(RemoteError::Spawn { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Err(GpuError::NoNvidiaSmi { host });
        }
        other => other?,
    };
    if !out.success() {
        // 127: the shell (or pct's exec) could not find the program.
        let stderr = out.stderr_lossy();
        if out.status == Some(127)
            || stderr.contains("No such file")
            || stderr.contains("not found")
        {
            return Err(GpuError::NoNvidiaSmi { host });
        }
        let message = first_line(&stderr).or_else(|| first_line(&out.stdout_lossy()));
        return Err(GpuError::NvidiaSmiFailed {
            host,
            status: out
                .status
                .map_or("unknown (killed?)".into(), |s| s.to_string()),
            message: message.unwrap_or_else(|| "no output".into()),
        });
    }
    Ok(out.stdout_lossy())
}

fn first_line(s: &str) -> Option<String> {
    s.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(str::to_string)
}

/// Reads this machine's GPUs through NVML.
pub struct Nvml {
    nvml: Arc<nvml_wrapper::Nvml>,
    host: String,
}

/// The driver, loaded at the first read of this run and kept: `fleet status` reads every local
/// host's GPUs and `down` confirms each release, and loading libnvidia-ml (or failing to) each
/// time costs more than the read. A failure is kept too, so later reads go to `nvidia-smi` at once.
static DRIVER: OnceLock<Result<Arc<nvml_wrapper::Nvml>, NoNvml>> = OnceLock::new();

/// Why NVML could not be loaded here: the library's own words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NoNvml(String);

impl Nvml {
    /// This run's NVML handle for `host`; fails on machines without the NVIDIA driver.
    pub async fn init(host: &str) -> Result<Self, NoNvml> {
        let driver = match DRIVER.get() {
            Some(driver) => driver.clone(),
            // Loading the library blocks in the dynamic loader and the driver.
            None => tokio::task::spawn_blocking(|| {
                DRIVER
                    .get_or_init(|| {
                        nvml_wrapper::Nvml::init()
                            .map(Arc::new)
                            .map_err(|e| NoNvml(e.to_string()))
                    })
                    .clone()
            })
            .await
            .map_err(|e| NoNvml(e.to_string()))?,
        };
        driver.map(|nvml| Nvml {
            nvml,
            host: host.to_string(),
        })
    }
}

#[async_trait]
impl GpuProbe for Nvml {
    async fn read(&self) -> Result<Vec<GpuReading>, GpuError> {
        let nvml = self.nvml.clone();
        let host = self.host.clone();
        // NVML calls block in the driver.
        tokio::task::spawn_blocking(move || read_nvml(&nvml))
            .await
            .map_err(|e| GpuError::Nvml {
                host: host.clone(),
                message: e.to_string(),
            })?
            .map_err(|e| GpuError::Nvml {
                host,
                message: e.to_string(),
            })
    }
}

fn read_nvml(nvml: &nvml_wrapper::Nvml) -> Result<Vec<GpuReading>, nvml_wrapper::error::NvmlError> {
    use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
    const MIB: u64 = 1024 * 1024;
    let count = nvml.device_count()?;
    let mut gpus = Vec::with_capacity(count as usize);
    for i in 0..count {
        let d = nvml.device_by_index(i)?;
        let mem = d.memory_info()?;
        gpus.push(GpuReading {
            index: d.index().unwrap_or(i),
            uuid: d.uuid()?,
            name: d.name()?,
            memory_total_mib: mem.total / MIB,
            memory_used_mib: mem.used / MIB,
            memory_free_mib: mem.free / MIB,
            utilization_pct: d.utilization_rates().ok().map(|u| u.gpu),
            temperature_c: d.temperature(TemperatureSensor::Gpu).ok(),
            power_w: d.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
        });
    }
    Ok(gpus)
}

/// Reads a host's GPUs: through NVML when the host is this machine and the driver loads,
/// otherwise with `nvidia-smi` over the host's transport.
pub async fn read_host(
    transport: Arc<dyn Transport>,
    is_local: bool,
) -> Result<Vec<GpuReading>, GpuError> {
    let mut nvml_error = None;
    if is_local {
        match Nvml::init(transport.host()).await {
            Ok(nvml) => return nvml.read().await,
            Err(e) => nvml_error = Some(e),
        }
    }
    match (NvidiaSmi { transport }).read().await {
        Err(GpuError::NoNvidiaSmi { host }) if nvml_error.is_some() => Err(GpuError::NoDriver {
            host,
            nvml: nvml_error.map(|e| e.to_string()).unwrap_or_default(),
        }),
        other => other,
    }
}

/// Parses `nvidia-smi --query-gpu=<NVIDIA_SMI_QUERY> --format=csv,noheader,nounits`.
/// On error returns (1-based line, what is wrong, the line).
pub fn parse_nvidia_smi_csv(text: &str) -> Result<Vec<GpuReading>, (usize, String, String)> {
    let mut gpus = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let bad = |m: String| (i + 1, m, line.to_string());
        if fields.len() != 9 {
            return Err(bad(format!(
                "expected 9 comma-separated fields, found {}",
                fields.len()
            )));
        }
        let num = |idx: usize, what: &str| -> Result<u64, (usize, String, String)> {
            fields[idx]
                .parse::<f64>()
                .map(|v| v as u64)
                .map_err(|_| bad(format!("{what} is not a number: {:?}", fields[idx])))
        };
        gpus.push(GpuReading {
            index: num(0, "index")? as u32,
            uuid: fields[1].to_string(),
            name: fields[2].to_string(),
            memory_total_mib: num(3, "memory.total")?,
            memory_used_mib: num(4, "memory.used")?,
            memory_free_mib: num(5, "memory.free")?,
            utilization_pct: optional(fields[6]).map(|v| v as u32),
            temperature_c: optional(fields[7]).map(|v| v as u32),
            power_w: optional(fields[8]),
        });
    }
    Ok(gpus)
}

/// nvidia-smi prints `[N/A]` or `[Not Supported]` for readings a GPU lacks.
fn optional(field: &str) -> Option<f64> {
    field.parse::<f64>().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compute_apps_are_placed_on_their_gpus_by_uuid() {
        let gpus = "0, GPU-aaa\n1, GPU-bbb\n";
        let apps = "4242, GPU-bbb, 30000, /usr/bin/python3, with, commas\n77, GPU-aaa, [N/A], x\n";
        let found = parse_processes(gpus, apps).unwrap();
        assert_eq!(
            found,
            [
                GpuProcess {
                    gpu: 1,
                    pid: 4242,
                    used_mib: 30000,
                    name: "/usr/bin/python3, with, commas".into()
                },
                GpuProcess {
                    gpu: 0,
                    pid: 77,
                    used_mib: 0,
                    name: "x".into()
                }
            ]
        );
        assert_eq!(parse_processes(gpus, "").unwrap(), []);
        let (line, message, _) = parse_processes(gpus, "1, GPU-zzz, 5, p\n").unwrap_err();
        assert_eq!(
            (line, message.as_str()),
            (1, "a GPU uuid that --query-gpu did not list")
        );
    }

    #[test]
    fn parses_blackwell_rows_and_missing_readings() {
        let text = "0, GPU-6c1f2a9e-0000-0000-0000-000000000000, NVIDIA RTX PRO 6000 Blackwell Server Edition, 97887, 84012, 13875, 97, 64, 583.21\n\
                    1, GPU-6c1f2a9e-0000-0000-0000-000000000001, NVIDIA RTX PRO 6000 Blackwell Server Edition, 97887, 0, 97887, [N/A], [Not Supported], [N/A]\n";
        let gpus = parse_nvidia_smi_csv(text).unwrap();
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[0].memory_used_mib, 84012);
        assert_eq!(gpus[0].utilization_pct, Some(97));
        assert_eq!(gpus[0].power_w, Some(583.21));
        assert_eq!(gpus[1].index, 1);
        assert_eq!(gpus[1].utilization_pct, None);
        assert_eq!(gpus[1].temperature_c, None);
    }

    #[test]
    fn rejects_a_short_line_with_its_number() {
        let err = parse_nvidia_smi_csv("0, GPU-x, name, 1, 2, 3, 4, 5, 6\n0, GPU-y\n").unwrap_err();
        assert_eq!(err.0, 2);
        assert!(err.1.contains("expected 9"));
    }

    #[test]
    fn rejects_a_non_numeric_memory_field() {
        let err = parse_nvidia_smi_csv("0, GPU-x, name, lots, 2, 3, 4, 5, 6\n").unwrap_err();
        assert!(err.1.contains("memory.total"), "{}", err.1);
    }
}
