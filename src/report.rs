//! Tables for people, and `fleet report`'s page: its model and its own text and HTML renderers
//! in the submodules (every other result goes through [`crate::render`]'s). Pure: values in,
//! strings out.

pub mod html;
pub mod job;
pub mod page;
pub mod search;
pub mod svg;
pub mod text;
pub mod timechart;

use serde::Serialize;
use tabled::builder::Builder;
use tabled::settings::Style;

use crate::gpu::GpuReading;

pub use crate::render::Format;

impl crate::render::Model for page::Page {
    fn title(&self) -> String {
        "fleet report".into()
    }

    fn text(&self) -> String {
        text::render(self)
    }

    fn page(&self) -> Option<String> {
        Some(html::render(self))
    }
}

/// `fleet report`'s page in `format`.
pub fn render(p: &page::Page, format: Format) -> String {
    // The page is plain data with string keys: it always serializes.
    crate::render::render(p, format).expect("the page always serializes")
}

/// Renders rows under a header as a plain, aligned table.
pub fn table<I, R>(header: &[&str], rows: I) -> String
where
    I: IntoIterator<Item = R>,
    R: IntoIterator<Item = String>,
{
    let mut b = Builder::default();
    b.push_record(header.iter().map(|h| h.to_string()));
    for r in rows {
        b.push_record(r);
    }
    b.build().with(Style::blank()).to_string()
}

/// One host's GPUs, or why they could not be read.
#[derive(Debug, Clone, Serialize)]
pub struct HostGpus {
    pub host: String,
    pub gpus: Vec<GpuReading>,
    pub error: Option<String>,
}

fn opt<T: std::fmt::Display>(v: Option<T>, unit: &str) -> String {
    v.map_or_else(|| "n/a".to_string(), |v| format!("{v}{unit}"))
}

/// `fleet gpus`: a titled table per host.
pub fn gpus_text(hosts: &[HostGpus]) -> String {
    let mut out = String::new();
    for h in hosts {
        match &h.error {
            Some(e) => {
                // Transport and GPU errors already lead with the host.
                let e = e.strip_prefix(&format!("{}: ", h.host)).unwrap_or(e);
                out.push_str(&format!("{}: error: {e}\n\n", h.host));
            }
            None => {
                out.push_str(&format!("{} ({} GPUs)\n", h.host, h.gpus.len()));
                let rows = h.gpus.iter().map(|g| {
                    vec![
                        g.index.to_string(),
                        g.name.clone(),
                        format!("{} / {} MiB", g.memory_used_mib, g.memory_total_mib),
                        opt(g.utilization_pct, "%"),
                        opt(g.temperature_c, "C"),
                        opt(g.power_w.map(|w| format!("{w:.0}")), " W"),
                    ]
                });
                out.push_str(&table(
                    &["GPU", "NAME", "MEMORY USED", "UTIL", "TEMP", "POWER"],
                    rows,
                ));
                out.push_str("\n\n");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, used: u64) -> GpuReading {
        GpuReading {
            index,
            uuid: format!("GPU-{index}"),
            name: "NVIDIA RTX PRO 6000 Blackwell Server Edition".into(),
            memory_total_mib: 97887,
            memory_used_mib: used,
            memory_free_mib: 97887 - used,
            utilization_pct: Some(97),
            temperature_c: None,
            power_w: Some(583.4),
        }
    }

    #[test]
    fn gpu_table_shows_memory_and_missing_readings() {
        let text = gpus_text(&[
            HostGpus {
                host: "ct200".into(),
                gpus: vec![gpu(0, 84012), gpu(1, 0)],
                error: None,
            },
            HostGpus {
                host: "box2".into(),
                gpus: vec![],
                error: Some("unreachable".into()),
            },
        ]);
        assert!(text.contains("ct200 (2 GPUs)"), "{text}");
        assert!(text.contains("84012 / 97887 MiB"), "{text}");
        assert!(text.contains("n/a"), "{text}");
        assert!(text.contains("583 W"), "{text}");
        assert!(text.contains("box2: error: unreachable"), "{text}");
    }
}
