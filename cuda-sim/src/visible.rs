//! `CUDA_VISIBLE_DEVICES`: which GPUs of the machine a process's driver enumerates, and in what
//! order (driver-facts F21). As NVIDIA documents it (CUDA Programming Guide, "CUDA Environment
//! Variables"): unset, every GPU; empty, none; else a comma-separated list of GPU indices (as
//! nvidia-smi numbers them) or `GPU-` UUIDs, a UUID abbreviable to a prefix that names one GPU
//! only; the GPUs are enumerated in the list's order, and the list ends before its first invalid
//! entry. Where neither the documentation nor a measurement says, the stricter reading (fewer
//! GPUs) is taken: an entry with anything but digits or a `GPU-` prefix, an ambiguous prefix, a
//! GPU named twice and MIG devices (not simulated) are invalid. NVML does not read it.

/// The environment variable the driver reads once, at `cuInit`.
pub const ENV: &str = "CUDA_VISIBLE_DEVICES";

/// The value of `CUDA_VISIBLE_DEVICES` in this process's environment: `None` when unset. A value
/// that is not UTF-8 names no GPU (unmeasured: the stricter reading).
pub fn from_env() -> Option<String> {
    std::env::var_os(ENV).map(|v| v.into_string().unwrap_or_default())
}

/// The indices into `gpus` (the machine's GPUs, in nvidia-smi order) that `spec` makes visible,
/// in the order the process enumerates them: its device ordinals.
pub fn select(spec: Option<&str>, gpus: &[[u8; 16]]) -> Vec<usize> {
    let Some(spec) = spec else {
        return (0..gpus.len()).collect();
    };
    let mut seen = Vec::new();
    for entry in spec.split(',') {
        match entry_gpu(entry, gpus) {
            Some(i) if !seen.contains(&i) => seen.push(i),
            _ => break,
        }
    }
    seen
}

/// The GPU one entry names, or `None` when it is invalid.
fn entry_gpu(entry: &str, gpus: &[[u8; 16]]) -> Option<usize> {
    if !entry.is_empty() && entry.bytes().all(|b| b.is_ascii_digit()) {
        return entry.parse().ok().filter(|&i| i < gpus.len());
    }
    // "GPU-" alone abbreviates nothing (unmeasured: stricter).
    if !entry.starts_with("GPU-") || entry.len() == "GPU-".len() {
        return None;
    }
    let mut named = (0..gpus.len()).filter(|&i| uuid_text(&gpus[i]).starts_with(entry));
    match (named.next(), named.next()) {
        (Some(i), None) => Some(i),
        _ => None,
    }
}

/// A GPU's UUID as nvidia-smi and NVML write it: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn uuid_text(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: [u8; 16] = [0xaa; 16];
    const B: [u8; 16] = [0xab; 16];
    const C: [u8; 16] = [0x12; 16];

    fn pick(spec: Option<&str>) -> Vec<usize> {
        select(spec, &[A, B, C])
    }

    #[test]
    fn unset_shows_every_gpu_and_empty_none() {
        assert_eq!(pick(None), [0, 1, 2]);
        assert_eq!(pick(Some("")), [] as [usize; 0]);
    }

    #[test]
    fn indices_are_enumerated_in_the_lists_order() {
        assert_eq!(pick(Some("1")), [1]);
        assert_eq!(pick(Some("2,0")), [2, 0]);
        assert_eq!(pick(Some("0,1,2")), [0, 1, 2]);
    }

    /// NVIDIA's example: 0,2,-1,1 shows 0 and 2, not 1.
    #[test]
    fn the_list_ends_before_its_first_invalid_entry() {
        assert_eq!(pick(Some("0,2,-1,1")), [0, 2]);
        assert_eq!(pick(Some("1,3,0")), [1], "an index past the last GPU");
        assert_eq!(pick(Some("1,,0")), [1], "an empty entry");
        assert_eq!(pick(Some("1, 0")), [1], "a space (unmeasured: stricter)");
        assert_eq!(
            pick(Some("1,1,0")),
            [1],
            "a GPU twice (unmeasured: stricter)"
        );
        assert_eq!(pick(Some("x,0")), [] as [usize; 0]);
        assert_eq!(pick(Some("MIG-GPU-12/0/0,0")), [] as [usize; 0]);
    }

    #[test]
    fn uuids_and_their_unambiguous_prefixes_name_gpus() {
        assert_eq!(pick(Some(&uuid_text(&C))), [2]);
        assert_eq!(pick(Some("GPU-12,GPU-ab")), [2, 1]);
        assert_eq!(
            pick(Some("GPU-a,1")),
            [] as [usize; 0],
            "GPU-a names two GPUs"
        );
        assert_eq!(pick(Some("12121212,0")), [] as [usize; 0], "no GPU- prefix");
        assert_eq!(
            select(Some("GPU-"), &[A]),
            [] as [usize; 0],
            "no digit of a UUID"
        );
        assert_eq!(
            pick(Some("GPU-AB")),
            [] as [usize; 0],
            "upper case (unmeasured)"
        );
    }

    #[test]
    fn uuid_text_is_nvidia_smis_form() {
        assert_eq!(uuid_text(&C), "GPU-12121212-1212-1212-1212-121212121212");
    }
}
