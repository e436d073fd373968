//! The plugin's own files in the image directory: JSON with a format name, a version and a
//! checksum, so that a truncated, edited or foreign file is refused with a clear message rather
//! than half-used.

use std::path::Path;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Larger files are refused: no record is anywhere near this.
pub const MAX_RECORD: u64 = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("cannot encode {name}: {reason}")]
    Encode { name: String, reason: String },
    #[error("cannot write {name} into the image directory: {source}")]
    Write {
        name: String,
        source: std::io::Error,
    },
    #[error(
        "the plugin image {path} is unusable ({why}); the checkpoint is incomplete or damaged: \
         copy the image directory again from its source"
    )]
    Unusable { path: String, why: String },
}

#[derive(Serialize, Deserialize)]
struct Envelope<T> {
    format: String,
    version: u32,
    fnv64: String,
    body: T,
}

fn fnv64(bytes: &[u8]) -> String {
    let h = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x1000_0000_01b3)
    });
    format!("{h:016x}")
}

/// Writes `body` as `dir/name` (atomically: a temporary file renamed into place).
pub fn write<T: Serialize>(
    dir: &Path,
    name: &str,
    format: &str,
    version: u32,
    body: &T,
) -> Result<(), RecordError> {
    let encode = |e: serde_json::Error| RecordError::Encode {
        name: name.to_owned(),
        reason: e.to_string(),
    };
    let body_bytes = serde_json::to_vec(body).map_err(encode)?;
    let env = Envelope {
        format: format.to_owned(),
        version,
        fnv64: fnv64(&body_bytes),
        body,
    };
    let text = serde_json::to_vec_pretty(&env).map_err(encode)?;
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, dir.join(name)))
        .map_err(|source| RecordError::Write {
            name: name.to_owned(),
            source,
        })
}

/// Reads `dir/name`; `Ok(None)` if it does not exist.
pub fn read<T: Serialize + DeserializeOwned>(
    dir: &Path,
    name: &str,
    format: &str,
    version: u32,
) -> Result<Option<T>, RecordError> {
    let path = dir.join(name);
    let corrupt = |why: String| RecordError::Unusable {
        path: path.display().to_string(),
        why,
    };
    let meta = match std::fs::metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(corrupt(e.to_string())),
    };
    if meta.len() > MAX_RECORD {
        return Err(corrupt(format!(
            "{} bytes, more than the {MAX_RECORD} allowed",
            meta.len()
        )));
    }
    let text = std::fs::read(&path).map_err(|e| corrupt(e.to_string()))?;
    let env: Envelope<serde_json::Value> =
        serde_json::from_slice(&text).map_err(|e| corrupt(format!("not valid JSON: {e}")))?;
    if env.format != format {
        return Err(corrupt(format!(
            "format {:?}, expected {format:?}",
            env.format
        )));
    }
    if env.version != version {
        return Err(corrupt(format!(
            "version {} written by another release of the plugin; this one reads version {version}",
            env.version
        )));
    }
    let body: T =
        serde_json::from_value(env.body).map_err(|e| corrupt(format!("bad contents: {e}")))?;
    let bytes = serde_json::to_vec(&body).map_err(|e| corrupt(e.to_string()))?;
    if fnv64(&bytes) != env.fnv64 {
        return Err(corrupt("checksum mismatch".into()));
    }
    Ok(Some(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Body {
        pids: Vec<i32>,
        name: String,
    }

    fn body() -> Body {
        Body {
            pids: vec![1, 2],
            name: "x".into(),
        }
    }

    /// Floats come back bit for bit (serde_json's float_roundtrip), so a record holding them
    /// passes its checksum (without that feature this test fails: a parsed float can differ in
    /// its last bit, and so does the re-encoded body).
    #[test]
    fn records_of_floats_pass_their_checksum() {
        let d = tempfile::tempdir().unwrap();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = vec![
                (x >> 11) as f64 / (1u64 << 53) as f64 * 7.3,
                (x % 1000) as f64 / 1e3,
            ];
            write(d.path(), "f.json", "test", 1, &v).unwrap();
            let back: Vec<f64> = read(d.path(), "f.json", "test", 1).unwrap().unwrap();
            assert_eq!(back, v);
        }
    }

    #[test]
    fn round_trip_and_absence() {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), "r.json", "test", 1, &body()).unwrap();
        assert_eq!(
            read::<Body>(d.path(), "r.json", "test", 1).unwrap(),
            Some(body())
        );
        assert_eq!(
            read::<Body>(d.path(), "missing.json", "test", 1).unwrap(),
            None
        );
    }

    #[test]
    fn damage_is_detected() {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), "r.json", "test", 1, &body()).unwrap();
        let p = d.path().join("r.json");
        let text = std::fs::read_to_string(&p).unwrap();
        // An edit that keeps the JSON valid is caught by the checksum.
        std::fs::write(&p, text.replace("\"x\"", "\"y\"")).unwrap();
        let e = read::<Body>(d.path(), "r.json", "test", 1).unwrap_err();
        assert!(e.to_string().contains("checksum mismatch"), "{e}");
        std::fs::write(&p, &text[..text.len() / 2]).unwrap();
        assert!(read::<Body>(d.path(), "r.json", "test", 1)
            .unwrap_err()
            .to_string()
            .contains("not valid JSON"));
        std::fs::write(&p, &text).unwrap();
        assert!(read::<Body>(d.path(), "r.json", "other", 1)
            .unwrap_err()
            .to_string()
            .contains("format"));
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(MAX_RECORD + 1).unwrap();
        assert!(read::<Body>(d.path(), "r.json", "test", 1)
            .unwrap_err()
            .to_string()
            .contains("allowed"));
    }
}
