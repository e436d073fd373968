use std::time::Duration;

use super::declared::*;
use super::*;

fn settings(env: &[(&str, &str)], file: &str) -> Settings {
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Settings::from_sources(&env, file, "/etc/criu/gpu-plugin.conf")
}

#[test]
fn environment_wins_over_the_file() {
    let file = "# comment\nCRIU_GPU_LOCK_TIMEOUT_MS = 7000\nCRIU_GPU_DEVICE_MAP=auto\n";
    let s = settings(&[], file);
    assert_eq!(s.get(&LOCK_TIMEOUT), Ok(Some(Duration::from_secs(7))));
    let s = settings(&[("CRIU_GPU_LOCK_TIMEOUT_MS", "250")], file);
    assert_eq!(s.get(&LOCK_TIMEOUT), Ok(Some(Duration::from_millis(250))));
    assert_eq!(settings(&[], "").get(&LOCK_TIMEOUT), Ok(None));
    assert_eq!(settings(&[], "").get(&PARALLEL), Ok(true));
}

#[test]
fn a_bad_value_fails_only_where_it_is_used_naming_key_file_and_fix() {
    let s = settings(&[], "CRIU_GPU_DIGESTS=maybe\nCRIU_GPU_PARALLEL=1\n");
    // Reading another setting is fine: the typo only matters to whoever needs the value.
    assert_eq!(s.get(&PARALLEL), Ok(true));
    let e = s.get(&DIGESTS).unwrap_err();
    assert_eq!((e.key, e.value.as_str()), ("CRIU_GPU_DIGESTS", "maybe"));
    let e = e.to_string();
    assert!(
        e.contains("/etc/criu/gpu-plugin.conf")
            && e.contains("use 1 or 0")
            && e.contains("remove it for the default (1)"),
        "{e}"
    );
}

#[test]
fn one_boolean_parser_takes_every_spelling_and_nothing_else() {
    for on in ["1", "yes", "YES", "true", "On", " 1 "] {
        assert_eq!(switch(on), Some(true), "{on}");
    }
    for off in ["0", "no", "NO", "false", "off"] {
        assert_eq!(switch(off), Some(false), "{off}");
    }
    for bad in ["", "2", "maybe", "y", "enabled"] {
        assert_eq!(switch(bad), None, "{bad}");
    }
    // CRIU's amdgpu plugin's spelling, and the lock rounds' words, go through it too.
    let s = settings(&[], "KFD_FW_VER_CHECK=NO\nCRIU_GPU_LOCK_ROUNDS=off\n");
    assert!(!s.kfd_checks().unwrap().fw_version);
    assert_eq!(
        s.get(&LOCK_ROUNDS),
        Ok(cuda_checkpoint_ctl::ops::rounds::Rounds::Off)
    );
    let e = settings(&[], "KFD_NUMA_CHECK=maybe")
        .kfd_checks()
        .unwrap_err();
    assert_eq!(e.key, "KFD_NUMA_CHECK");
}

#[test]
fn unknown_keys_with_our_prefix_are_reported() {
    let s = settings(&[], "CRIU_GPU_LOCK_TIMOUT_MS=9000\nCUDA_CKPT_LIBCUDA=/x\n");
    let unknown: Vec<&str> = s.unknown().into_iter().map(|(k, _)| k).collect();
    assert_eq!(unknown, ["CRIU_GPU_LOCK_TIMOUT_MS"]);
}

#[test]
fn the_file_names_the_libraries_and_nothing_but_settings_is_taken() {
    // The simulated driver's lines are its own to read (cuda_sim::config); PATH is nobody's.
    let file = "CUDA_CKPT_LIBCUDA=/opt/lib/libcuda.so.1\nCUDA_SIM_SOCKET=/run/s\n\
                PATH=/evil\nKFD_FW_VER_CHECK=\n";
    let s = settings(&[("CUDA_SIM_TRACE", "/mine")], file);
    assert_eq!(
        s.get(&LIBCUDA),
        Ok(Some("/opt/lib/libcuda.so.1".to_owned()))
    );
    assert_eq!(s.values.keys().collect::<Vec<_>>(), ["CUDA_CKPT_LIBCUDA"]);
    assert!(s.unknown().is_empty(), "{:?}", s.unknown());
}

#[test]
fn a_tool_s_option_wins_and_is_named_when_bad() {
    let s = settings(&[("CRIU_GPU_DEVICE_MAP", "auto")], "");
    let e = s
        .with(&DEVICE_MAP, "GPU-x", "--device-map")
        .get(&DEVICE_MAP);
    assert!(e
        .unwrap_err()
        .to_string()
        .contains("the option --device-map"));
}

/// Setting `s` to the default it shows reads as leaving it out.
fn shows_its_value<T: PartialEq + std::fmt::Debug>(s: &Setting<T>) {
    let written = settings(&[], &format!("{}={}", s.key, s.default));
    assert_eq!(written.get(s), Settings::default().get(s), "{}", s.key);
}

#[test]
fn every_default_shown_is_the_value_it_stands_for() {
    for s in [&PARALLEL, &DIGESTS, &OVERLAP, &NCCL_CHECK] {
        shows_its_value(s);
    }
    for (s, _) in KFD_CHECKS {
        shows_its_value(s);
    }
    shows_its_value(&THP);
    shows_its_value(&LOCK_ROUNDS);
    shows_its_value(&AMD_FD_BASE);
    // The others' defaults are worked out when they are used; absent, they read as none.
    assert_eq!(Settings::default().get(&LOCK_TIMEOUT), Ok(None));
    assert_eq!(Settings::default().get(&ACTION_TIMEOUT), Ok(None));
    assert_eq!(Settings::default().get(&LIBCUDA), Ok(None));
}

/// A row of one of docs/settings.md's tables of variables (header `| variable | ...`), with
/// backticks and links as plain text.
#[derive(Debug)]
struct DocRow {
    section: String,
    key: String,
    meaning: String,
    default: String,
}

/// Markdown as plain text: no backticks, `[text](link)` as its text, `\|` as `|`.
fn plain(cell: &str) -> String {
    let mut out = String::new();
    let mut rest = cell.replace('`', "").replace("\\|", "|");
    while let Some(open) = rest.find("](") {
        let (Some(text), Some(close)) = (rest[..open].rfind('['), rest[open..].find(')')) else {
            break;
        };
        out.push_str(&rest[..text]);
        out.push_str(&rest[text + 1..open]);
        rest = rest[open + close + 1..].to_owned();
    }
    out.push_str(&rest);
    out
}

/// The rows of every table of variables in docs/settings.md, a row per key.
fn documented() -> Vec<DocRow> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/settings.md"))
        .expect("docs/settings.md");
    let mut section = String::new();
    let mut variables = false;
    let mut rows = Vec::new();
    for line in doc.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            section = h.to_owned();
        }
        if line.starts_with("|---") {
            continue;
        }
        let Some(inner) = line.strip_prefix("| ").and_then(|l| l.strip_suffix(" |")) else {
            variables = false;
            continue;
        };
        let cells: Vec<&str> = inner.split(" | ").collect();
        if cells[0] == "variable" {
            variables = true;
            continue;
        }
        let Some(key) = cells[0].strip_prefix('`').filter(|_| variables) else {
            continue;
        };
        let key = key
            .trim_end_matches('`')
            .split('=')
            .next()
            .unwrap_or_default();
        assert_eq!(
            cells.len(),
            3,
            "docs/settings.md: the row of {key} needs 3 cells"
        );
        rows.push(DocRow {
            section: section.clone(),
            key: key.to_owned(),
            meaning: plain(cells[1]),
            default: plain(cells[2]),
        });
    }
    rows
}

/// The simulated driver's own variables: it reads them itself (cuda-sim/src/config.rs, whose
/// test checks they are documented), so they are declared there, not here.
const SIMULATED_DRIVER: &str = "CUDA_SIM_";

#[test]
fn docs_settings_md_documents_every_setting_as_declared_and_no_other() {
    let rows = documented();
    for r in ALL {
        let Some(row) = rows.iter().find(|d| d.key == r.key) else {
            panic!("{} is not in docs/settings.md", r.key);
        };
        assert_eq!(
            row.default, r.default,
            "the default of {} in docs/settings.md",
            r.key
        );
        assert!(
            row.meaning.contains(r.meaning),
            "the meaning of {} in docs/settings.md ({:?}) does not say what declared.rs does: {:?}",
            r.key,
            row.meaning,
            r.meaning
        );
    }
    // A build without the simulations declares no simulated KFD; its row stays documented.
    let simulation_only =
        |key: &str| cfg!(not(feature = "simulation")) && key == "AMD_KFD_SIM_ROOT";
    for DocRow { section, key, .. } in &rows {
        let simulated = section == "The simulated GPU"
            && (key.starts_with(SIMULATED_DRIVER) || simulation_only(key));
        assert!(
            simulated || ALL.iter().any(|r| r.key == key),
            "docs/settings.md ({section}) documents {key}, which no setting declares"
        );
        let rows_of_key = rows.iter().filter(|d| &d.key == key).count();
        assert_eq!(rows_of_key, 1, "docs/settings.md documents {key} twice");
    }
}
