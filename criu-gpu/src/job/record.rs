//! What `criu-gpu dump` leaves in the image directory for `criu-gpu restore`: the job's processes
//! (to tell whether they still run), the listening addresses it must get back, and the CRIU
//! options the restore needs. Checksummed like the plugin's own records.

use std::net::SocketAddr;
use std::path::Path;

use criu_gpu_image::record::{self, RecordError};
use serde::{Deserialize, Serialize};

pub const FILE: &str = "criu-gpu-job.json";
const FORMAT: &str = "criu-gpu/job";
const VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    pub root: i32,
    /// (pid, start time, name) of each process at dump time.
    pub members: Vec<(i32, u64, String)>,
    pub listeners: Vec<SocketAddr>,
    /// CRIU's options for the restore.
    pub restore_args: Vec<String>,
    /// Seconds since the epoch.
    pub dumped_at: u64,
}

impl JobRecord {
    pub fn write(&self, dir: &Path) -> Result<(), RecordError> {
        record::write(dir, FILE, FORMAT, VERSION, self)
    }

    pub fn read(dir: &Path) -> Result<Option<JobRecord>, RecordError> {
        record::read(dir, FILE, FORMAT, VERSION)
    }
}
