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

/// The rows of docs/settings.md's tables: (section, key, last cell), a row per key.
fn documented() -> Vec<(String, String, String)> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/settings.md"))
        .expect("docs/settings.md");
    let mut section = String::new();
    let mut rows = Vec::new();
    for line in doc.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            section = h.to_owned();
        }
        let cells: Vec<&str> = line.split(" | ").collect();
        let Some(key) = cells[0]
            .strip_prefix("| `")
            .and_then(|k| k.strip_suffix('`'))
        else {
            continue;
        };
        let last = cells.last().unwrap_or(&"").trim_end_matches(" |");
        rows.push((section.clone(), key.to_owned(), last.replace('`', "")));
    }
    rows
}

#[test]
fn docs_settings_md_documents_every_setting_with_its_default_and_no_other() {
    let rows = documented();
    for r in ALL {
        let Some((_, _, default)) = rows.iter().find(|(_, k, _)| k == r.key) else {
            panic!("{} is not in docs/settings.md", r.key);
        };
        assert_eq!(
            default, r.default,
            "the default of {} in docs/settings.md",
            r.key
        );
    }
    for (section, key, _) in &rows {
        if ["The plugin", "AMD GPU matching"].contains(&section.as_str()) {
            assert!(
                ALL.iter().any(|r| r.key == key),
                "docs/settings.md ({section}) documents {key}, which no setting declares"
            );
        }
    }
}
