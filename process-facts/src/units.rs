//! Sizes and rates as people read them, and switches as people write them: one way for every
//! tool, setting and log of the project.

use std::time::Duration;

const GIB: f64 = (1u64 << 30) as f64;

/// Bytes in GiB, for a log's `{:.2} GiB`.
pub fn gib(bytes: u64) -> f64 {
    bytes as f64 / GIB
}

/// `1.50 GiB`: a size in GiB whatever its magnitude, for tables and messages that compare.
pub fn in_gib(bytes: u64) -> String {
    format!("{:.2} GiB", gib(bytes))
}

/// `1536` -> `1.50 KiB`, `512` -> `512 B`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[unit])
    }
}

/// Throughput in decimal GB/s, as storage and networks are rated.
pub fn gbps(bytes: u64, took: Duration) -> String {
    let secs = took.as_secs_f64().max(1e-3);
    format!("{:.2} GB/s", bytes as f64 / 1e9 / secs)
}

/// What [`switch`] takes, for messages.
pub const SWITCH_WORDS: &str = "1 or 0 (also yes or no, true or false, on or off, in any case)";

/// A switch as people write it: `1`, `yes`, `true`, `on` or `0`, `no`, `false`, `off`, in any
/// case (CRIU's amdgpu plugin writes `YES` and `NO`). The workspace's one boolean parser: the
/// plugin's settings, `cuda-checkpoint-ctl --lock-rounds`, `CRIU_GPU_THP=off`.
pub fn switch(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "yes" | "true" | "on" => Some(true),
        "0" | "no" | "false" | "off" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_naturally() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.50 KiB");
        assert_eq!(bytes(16 << 30), "16.00 GiB");
        assert_eq!(gbps(2_000_000_000, Duration::from_secs(1)), "2.00 GB/s");
        assert_eq!(gib(3 << 29), 1.5);
    }
}
