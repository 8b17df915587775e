//! `fleet profile show|check`: print a resolved profile, validate profiles.

use crate::cli::ProfileCommand;

use super::{Ctx, Outcome};

pub fn run(_ctx: &Ctx, _cmd: &ProfileCommand) -> anyhow::Result<Outcome> {
    anyhow::bail!("profile: not built yet")
}
