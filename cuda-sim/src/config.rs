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
    let path = std::env::var(SETTINGS_ENV)
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| SETTINGS_FILE.to_owned());
    in_file(&std::fs::read_to_string(path).ok()?, key)
}

fn in_file(text: &str, key: &str) -> Option<String> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter_map(|l| l.split_once('='))
        .filter(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim().to_owned())
        .next_back()
        .filter(|v| !v.is_empty())
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
    }
}
