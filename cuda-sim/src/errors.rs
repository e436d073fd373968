//! `CUresult` values the simulation returns, with the names and descriptions the real
//! `cuGetErrorName`/`cuGetErrorString` give for them.

pub mod code {
    pub const SUCCESS: u32 = 0;
    pub const INVALID_VALUE: u32 = 1;
    pub const OUT_OF_MEMORY: u32 = 2;
    pub const NOT_INITIALIZED: u32 = 3;
    pub const NO_DEVICE: u32 = 100;
    pub const INVALID_DEVICE: u32 = 101;
    pub const INVALID_CONTEXT: u32 = 201;
    pub const OPERATING_SYSTEM: u32 = 304;
    pub const ILLEGAL_STATE: u32 = 401;
    pub const NOT_FOUND: u32 = 500;
    pub const NOT_READY: u32 = 600;
    pub const NOT_PERMITTED: u32 = 800;
    pub const NOT_SUPPORTED: u32 = 801;
    pub const TIMEOUT: u32 = 909;
    pub const UNKNOWN: u32 = 999;
}

const TABLE: &[(u32, &str, &str)] = &[
    (0, "CUDA_SUCCESS\0", "no error\0"),
    (1, "CUDA_ERROR_INVALID_VALUE\0", "invalid argument\0"),
    (2, "CUDA_ERROR_OUT_OF_MEMORY\0", "out of memory\0"),
    (3, "CUDA_ERROR_NOT_INITIALIZED\0", "initialization error\0"),
    (
        100,
        "CUDA_ERROR_NO_DEVICE\0",
        "no CUDA-capable device is detected\0",
    ),
    (
        101,
        "CUDA_ERROR_INVALID_DEVICE\0",
        "invalid device ordinal\0",
    ),
    (
        201,
        "CUDA_ERROR_INVALID_CONTEXT\0",
        "invalid device context\0",
    ),
    (
        304,
        "CUDA_ERROR_OPERATING_SYSTEM\0",
        "OS call failed or operation not supported on this OS\0",
    ),
    (
        401,
        "CUDA_ERROR_ILLEGAL_STATE\0",
        "the operation cannot be performed in the present state\0",
    ),
    (500, "CUDA_ERROR_NOT_FOUND\0", "named symbol not found\0"),
    (600, "CUDA_ERROR_NOT_READY\0", "device not ready\0"),
    (
        800,
        "CUDA_ERROR_NOT_PERMITTED\0",
        "operation not permitted\0",
    ),
    (
        801,
        "CUDA_ERROR_NOT_SUPPORTED\0",
        "operation not supported\0",
    ),
    (909, "CUDA_ERROR_TIMEOUT\0", "timeout occurred\0"),
    (999, "CUDA_ERROR_UNKNOWN\0", "unknown error\0"),
];

/// NUL-terminated name, as `cuGetErrorName` returns it.
pub fn name(code: u32) -> Option<&'static str> {
    TABLE.iter().find(|e| e.0 == code).map(|e| e.1)
}

/// NUL-terminated description, as `cuGetErrorString` returns it.
pub fn description(code: u32) -> Option<&'static str> {
    TABLE.iter().find(|e| e.0 == code).map(|e| e.2)
}

/// Parses `CUDA_ERROR_OUT_OF_MEMORY`, `OUT_OF_MEMORY` or `2`.
pub fn parse(text: &str) -> Option<u32> {
    let t = text.trim();
    if let Ok(n) = t.parse() {
        return Some(n);
    }
    let full = if t.starts_with("CUDA_") {
        t.to_owned()
    } else {
        format!("CUDA_ERROR_{t}")
    };
    TABLE
        .iter()
        .find(|e| e.1.trim_end_matches('\0') == full)
        .map(|e| e.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_nul_terminated_and_parse_back() {
        for (c, n, d) in TABLE {
            assert!(n.ends_with('\0') && d.ends_with('\0'));
            assert_eq!(parse(n.trim_end_matches('\0')), Some(*c));
        }
        assert_eq!(parse("OUT_OF_MEMORY"), Some(2));
        assert_eq!(parse("909"), Some(909));
        assert_eq!(parse("NOPE"), None);
    }
}
