//! A host's GPU board as `nvidia-smi topo -m` prints it: the link class between every two GPUs
//! and each GPU's NUMA node.

use std::fmt;

/// How two GPUs reach each other, as `nvidia-smi topo -m` names it. Ordered from slowest to
/// fastest, so `max` is the better link and `min` the bottleneck.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Link {
    /// PCIe plus the interconnect between NUMA nodes (QPI/UPI): across sockets.
    Sys,
    /// PCIe plus the interconnect between host bridges within one NUMA node.
    Node,
    /// PCIe through a host bridge (the CPU).
    Phb,
    /// Several PCIe bridges, without the host bridge.
    Pxb,
    /// At most one PCIe bridge: the same PCIe switch.
    Pix,
    /// A bonded set of this many NVLinks.
    Nv(u32),
}

impl Link {
    /// `X`, the diagonal, is no link; anything else that is not a link class is `None`.
    pub fn parse(cell: &str) -> Option<Link> {
        match cell {
            "SYS" => Some(Link::Sys),
            "NODE" => Some(Link::Node),
            "PHB" => Some(Link::Phb),
            "PXB" => Some(Link::Pxb),
            "PIX" => Some(Link::Pix),
            _ => cell
                .strip_prefix("NV")
                .and_then(|n| n.parse().ok())
                .map(Link::Nv),
        }
    }
}

impl serde::Serialize for Link {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Link {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Link, D::Error> {
        let text = String::deserialize(d)?;
        Link::parse(&text)
            .ok_or_else(|| serde::de::Error::custom(format!("`{text}` is not a link class")))
    }
}

impl fmt::Display for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Link::Sys => f.write_str("SYS"),
            Link::Node => f.write_str("NODE"),
            Link::Phb => f.write_str("PHB"),
            Link::Pxb => f.write_str("PXB"),
            Link::Pix => f.write_str("PIX"),
            Link::Nv(n) => write!(f, "NV{n}"),
        }
    }
}

/// The GPUs of one host and how they are linked, indexed by nvidia-smi's GPU index (PCI bus
/// order, the order fleet pins servers by).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Board {
    gpus: Vec<u32>,
    /// `links[i][j]` between `gpus[i]` and `gpus[j]`; `None` on the diagonal.
    links: Vec<Vec<Option<Link>>>,
    numa: Vec<Option<u32>>,
}

/// Why a `topo -m` table could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    #[error("no header row naming the GPUs (GPU0 GPU1 ...)")]
    NoHeader,
    #[error("row `{row}`: {cells} link cells where the header names {devices} devices")]
    ShortRow {
        row: String,
        cells: usize,
        devices: usize,
    },
    #[error(
        "row `{row}`, column `{column}`: `{cell}` is not a link class (X, SYS, NODE, PHB, PXB, PIX, NV#)"
    )]
    BadCell {
        row: String,
        column: String,
        cell: String,
    },
    #[error("GPU{gpu} has a header column but no row")]
    MissingRow { gpu: u32 },
}

impl Board {
    /// Reads `nvidia-smi topo -m`. The header row is wrapped in terminal escape codes
    /// (underline on, off) even when piped; NIC columns and the legend are skipped.
    pub fn parse(text: &str) -> Result<Board, TopologyError> {
        let lines: Vec<String> = text.lines().map(strip_escapes).collect();
        let header = lines
            .iter()
            .find(|l| {
                l.split_whitespace()
                    .next()
                    .is_some_and(|t| gpu_index(t).is_some())
            })
            .ok_or(TopologyError::NoHeader)?;
        // The device columns are every token before "CPU Affinity"; NICs are among them.
        let devices: Vec<&str> = header
            .split_whitespace()
            .take_while(|t| *t != "CPU")
            .collect();
        let gpus: Vec<u32> = devices.iter().filter_map(|d| gpu_index(d)).collect();
        let mut links = vec![vec![None; gpus.len()]; gpus.len()];
        let mut numa = vec![None; gpus.len()];
        let mut seen = vec![false; gpus.len()];
        for line in &lines {
            let mut tokens = line.split_whitespace();
            let Some(row) = tokens.next() else { continue };
            let Some(i) = gpu_index(row).and_then(|g| gpus.iter().position(|x| *x == g)) else {
                continue;
            };
            if std::ptr::eq(line, header) {
                continue;
            }
            let cells: Vec<&str> = tokens.collect();
            if cells.len() < devices.len() {
                return Err(TopologyError::ShortRow {
                    row: row.into(),
                    cells: cells.len(),
                    devices: devices.len(),
                });
            }
            for (column, cell) in devices.iter().zip(&cells) {
                let Some(j) = gpu_index(column).and_then(|g| gpus.iter().position(|x| *x == g))
                else {
                    continue;
                };
                let link = Link::parse(cell);
                if link.is_none() && *cell != "X" {
                    return Err(TopologyError::BadCell {
                        row: row.into(),
                        column: (*column).into(),
                        cell: (*cell).into(),
                    });
                }
                links[i][j] = link;
            }
            // After the links: CPU affinity, NUMA affinity ("N/A" on single-socket boards).
            numa[i] = cells.get(devices.len() + 1).and_then(|n| n.parse().ok());
            seen[i] = true;
        }
        if let Some(i) = seen.iter().position(|s| !s) {
            return Err(TopologyError::MissingRow { gpu: gpus[i] });
        }
        Ok(Board { gpus, links, numa })
    }

    pub fn gpus(&self) -> &[u32] {
        &self.gpus
    }

    /// The link between two GPUs of the board; `None` for one GPU with itself or a GPU the
    /// board does not have.
    pub fn link(&self, a: u32, b: u32) -> Option<Link> {
        let i = self.position(a)?;
        let j = self.position(b)?;
        self.links[i][j].or(self.links[j][i])
    }

    pub fn numa(&self, gpu: u32) -> Option<u32> {
        self.numa[self.position(gpu)?]
    }

    /// The slowest link between any two of `gpus`; `None` for a single GPU.
    pub fn slowest(&self, gpus: &[u32]) -> Option<Link> {
        pairs(gpus).filter_map(|(a, b)| self.link(a, b)).min()
    }

    /// Whether `gpus` sit on one NUMA node (unknown NUMA counts as one node).
    pub fn one_numa_node(&self, gpus: &[u32]) -> bool {
        let mut nodes = gpus.iter().filter_map(|g| self.numa(*g));
        nodes.next().is_none_or(|first| nodes.all(|n| n == first))
    }

    fn position(&self, gpu: u32) -> Option<usize> {
        self.gpus.iter().position(|g| *g == gpu)
    }
}

fn pairs(gpus: &[u32]) -> impl Iterator<Item = (u32, u32)> + '_ {
    gpus.iter()
        .enumerate()
        .flat_map(move |(i, a)| gpus[i + 1..].iter().map(move |b| (*a, *b)))
}

fn gpu_index(token: &str) -> Option<u32> {
    token.strip_prefix("GPU")?.parse().ok()
}

/// Removes ANSI escape sequences (`ESC [ ... letter`).
fn strip_escapes(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An 8-GPU PCIe board (no NVLink) whose switch pairs are not numbered in order: GPU 0 and
    /// 2 share a switch, as do 1 and 3, 4 and 6, 5 and 7; 0–3 are on socket 0, 4–7 on socket 1.
    pub(crate) const PCIE_UNORDERED: &str =
        include_str!("../../tests/fixtures/boards/pcie-8-unordered.txt");
    /// An 8-GPU NVLink board (all NV18), from a DGX-style machine, with two NICs.
    pub(crate) const NVLINK_8: &str = include_str!("../../tests/fixtures/boards/nvlink-8.txt");

    #[test]
    fn reads_the_links_and_numa_nodes_through_the_escape_codes() {
        assert!(PCIE_UNORDERED.contains('\u{1b}'));
        let b = Board::parse(PCIE_UNORDERED).unwrap();
        assert_eq!(b.gpus(), &[0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(b.link(0, 2), Some(Link::Pix));
        assert_eq!(b.link(0, 1), Some(Link::Node));
        assert_eq!(b.link(3, 4), Some(Link::Sys));
        assert_eq!(b.link(2, 2), None);
        assert_eq!((b.numa(1), b.numa(6)), (Some(0), Some(1)));
        assert_eq!(b.slowest(&[0, 2]), Some(Link::Pix));
        assert_eq!(b.slowest(&[0, 1, 2, 3]), Some(Link::Node));
        assert_eq!(b.slowest(&[5]), None);
        assert!(b.one_numa_node(&[0, 1, 2, 3]) && !b.one_numa_node(&[3, 4]));
        let nv = Board::parse(NVLINK_8).unwrap();
        assert_eq!(nv.gpus().len(), 8);
        assert_eq!(nv.slowest(&[0, 1, 2, 3, 4, 5, 6, 7]), Some(Link::Nv(18)));
    }

    #[test]
    fn links_order_from_slowest_to_fastest() {
        let order = ["SYS", "NODE", "PHB", "PXB", "PIX", "NV2", "NV18"].map(Link::parse);
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");
        assert_eq!(Link::Nv(12).to_string(), "NV12");
        assert_eq!(Link::parse("X"), None);
    }

    #[test]
    fn unreadable_tables_say_why() {
        assert_eq!(
            Board::parse("No devices were found"),
            Err(TopologyError::NoHeader)
        );
        let short = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \nGPU1\tPIX\t X \t0-7\t0\n";
        assert!(matches!(
            Board::parse(short),
            Err(TopologyError::ShortRow { .. })
        ));
        let bad = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tFOO\t0\t0\nGPU1\tFOO\t X \t0\t0\n";
        assert_eq!(
            Board::parse(bad).unwrap_err().to_string(),
            "row `GPU0`, column `GPU1`: `FOO` is not a link class (X, SYS, NODE, PHB, PXB, PIX, NV#)"
        );
    }
}
