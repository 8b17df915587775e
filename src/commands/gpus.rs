//! `fleet gpus`: the GPU table of every host.

use super::{Ctx, Outcome};

pub async fn run(_ctx: &Ctx) -> anyhow::Result<Outcome> {
    anyhow::bail!("gpus: not built yet")
}
