//! `fleet exec`: run one argv on every host of the inventory.

use crate::cli::ExecArgs;

use super::{Ctx, Outcome};

pub async fn run(_ctx: &Ctx, _args: &ExecArgs) -> anyhow::Result<Outcome> {
    anyhow::bail!("exec: not built yet")
}
