//! How settings' values are read: one parser per kind of value, the workspace's one boolean
//! parser ([`switch`], process-facts') for every switch (the plugin's, CRIU's amdgpu plugin's
//! `KFD_*_CHECK`, the lock rounds, `CRIU_GPU_THP=off`).

use std::time::Duration;

use criu_gpu_image::addrmap::{AddressMap, MapError};
use cuda_checkpoint_ctl::ops::rounds::Rounds;
use cuda_checkpoint_ctl::placement::Request;

use crate::thp::Want;

pub use process_facts::units::switch;
use process_facts::units::SWITCH_WORDS;

pub(super) fn flag(v: &str) -> Result<bool, String> {
    switch(v).ok_or_else(|| format!("use {SWITCH_WORDS}"))
}

pub(super) fn some_millis(v: &str) -> Result<Option<Duration>, String> {
    let ms: u64 = v.trim().parse().map_err(|_| "a number of milliseconds")?;
    Ok(Some(Duration::from_millis(ms.max(1))))
}

pub(super) fn some_seconds(v: &str) -> Result<Option<Duration>, String> {
    let s: u64 = v.trim().parse().map_err(|_| "a number of seconds")?;
    Ok(Some(Duration::from_secs(s.max(1))))
}

pub(super) fn device_map(v: &str) -> Result<Request, String> {
    v.parse::<Request>()
        .map_err(|e| format!("{e}; use OLD_UUID=NEW_UUID[,...], auto or same"))
}

pub(super) fn thp(v: &str) -> Result<Want, String> {
    v.trim().parse::<Want>()
}

/// `auto`, or a switch: on locks any group in rounds, off locks once.
pub(super) fn rounds(v: &str) -> Result<Rounds, String> {
    v.parse()
}

pub(super) fn fd_base(v: &str) -> Result<i32, String> {
    v.trim()
        .parse()
        .ok()
        .filter(|n| (3..=1 << 20).contains(n))
        .ok_or_else(|| "an fd number from 3 to 1048576".to_owned())
}

/// An address map; an empty one moves nothing.
pub(super) fn address_map(v: &str) -> Result<Option<AddressMap>, String> {
    let map: AddressMap = v.parse().map_err(|e: MapError| e.to_string())?;
    Ok(Some(map).filter(|m| !m.is_empty()))
}

pub(super) fn some_text(v: &str) -> Result<Option<String>, String> {
    Ok(Some(v.trim().to_owned()))
}

pub(super) fn some_path(v: &str) -> Result<Option<std::path::PathBuf>, String> {
    Ok(Some(v.trim().into()))
}
