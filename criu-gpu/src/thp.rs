//! `criu-gpu thp -- CMD`: a command run with the node's transparent huge pages at `always`
//! (for benchmarks), through the guardians' own raise and put-back ([`criu_gpu_host::thp`]),
//! never by writing the knob here.

use criu_gpu_host::thp::{Thp, Want};

use crate::error::Error;

/// Runs `command` (program and arguments) with huge pages at `always`, put back after; its
/// exit status.
pub fn with_huge_pages(command: &[String]) -> Result<u8, Error> {
    let Some((program, args)) = command.split_first() else {
        return Err(Error::Usage("thp: name the command to run after --".into()));
    };
    let thp = Thp::default();
    let me = std::process::id() as i32;
    let raised = thp
        .raise(Want::Always, me)
        .map_err(|e| Error::Usage(format!("transparent huge pages: {e}")))?;
    tracing::info!("transparent huge pages: {raised:?}");
    let status = std::process::Command::new(program).args(args).status();
    if let Err(e) = thp.lower(me) {
        tracing::warn!("transparent huge pages could not be put back: {e}");
    }
    let status = status.map_err(|e| Error::Usage(format!("{program}: {e}")))?;
    Ok(status.code().map_or(1, |c| c.clamp(0, 255) as u8))
}
