//! The simulated driver's own variables (`CUDA_SIM_*`): from the environment of the process that
//! loads it, else from the plugin's settings file (`CRIU_GPU_CONFIG`, else
//! `/etc/criu/gpu-plugin.conf`). Container runtimes start CRIU, and so the guardian that loads the
//! driver, with an environment of their own; the settings file is how a test names the simulated
//! GPU to them. The plugin passes nothing on: the simulation reads its own configuration, as a
//! real driver does.

/// The plugin's settings file unless `CRIU_GPU_CONFIG` names another (as the plugin reads it).
const SETTINGS_FILE: &str = "/etc/criu/gpu-plugin.conf";
const SETTINGS_ENV: &str = "CRIU_GPU_CONFIG";

/// The value of `key`: the environment's, else the settings file's last `KEY=VALUE` line for it
/// (`#` starts a comment). `None` when neither sets it, or sets it empty.
pub fn var(key: &str) -> Option<String> {
    if let Some(v) = std::env::var(key).ok().filter(|v| !v.is_empty()) {
        return Some(v);
    }
    let path = settings_file(std::env::var(SETTINGS_ENV).ok())?;
    in_file(&std::fs::read_to_string(path).ok()?, key)
}

/// The settings file, found as the plugin finds it (criu-gpu-host's `Settings::load`):
/// `CRIU_GPU_CONFIG` when set, none when it is set empty, else the default file.
fn settings_file(config_env: Option<String>) -> Option<String> {
    match config_env {
        Some(path) if path.is_empty() => None,
        Some(path) => Some(path),
        None => Some(SETTINGS_FILE.to_owned()),
    }
}

/// The file's last non-empty value for `key`, as the plugin reads the file (an empty line for a
/// key does not hide an earlier value).
pub fn in_file(text: &str, key: &str) -> Option<String> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter_map(|l| l.split_once('='))
        .filter(|(k, v)| k.trim() == key && !v.trim().is_empty())
        .map(|(_, v)| v.trim().to_owned())
        .next_back()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_s_last_line_for_the_key_counts() {
        let file = "# CUDA_SIM_SOCKET=/commented\nCUDA_SIM_SOCKET = /a\nCUDA_SIM_SOCKET=/b # why\n\
                    CUDA_SIM_TRACE=\nCUDA_SIM_SOCKETS=/c\n";
        assert_eq!(in_file(file, "CUDA_SIM_SOCKET").as_deref(), Some("/b"));
        assert_eq!(in_file(file, "CUDA_SIM_TRACE"), None);
        assert_eq!(in_file(file, "CUDA_SIM_FAULT"), None);
        let emptied = "CUDA_SIM_SOCKET=/a\nCUDA_SIM_SOCKET=\n";
        assert_eq!(in_file(emptied, "CUDA_SIM_SOCKET").as_deref(), Some("/a"));
    }

    /// As the plugin: `CRIU_GPU_CONFIG` set empty means no file, not the default one.
    #[test]
    fn an_empty_config_variable_reads_no_file() {
        assert_eq!(settings_file(Some(String::new())), None);
        assert_eq!(
            settings_file(Some("/x.conf".into())).as_deref(),
            Some("/x.conf")
        );
        assert_eq!(settings_file(None).as_deref(), Some(SETTINGS_FILE));
    }

    /// docs/settings.md's table of the simulated GPU lists this driver's own variables, which
    /// criu-gpu-host's settings do not declare (its test leaves `CUDA_SIM_*` rows to this one).
    #[test]
    fn docs_settings_md_lists_the_simulated_driver_s_variables_and_no_other() {
        let doc =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/settings.md"))
                .unwrap();
        let mut documented: Vec<&str> = doc
            .lines()
            .filter_map(|l| l.strip_prefix("| `CUDA_SIM_"))
            .map(|l| l.split(['`', '=']).next().unwrap_or_default())
            .collect();
        documented.sort_unstable();
        let ours = [
            crate::fault::FAULT_ENV,
            crate::proto::SOCKET_ENV,
            crate::trace::TRACE_ENV,
        ];
        let ours: Vec<&str> = ours.iter().map(|k| &k["CUDA_SIM_".len()..]).collect();
        assert_eq!(documented, ours);
    }
}
