//! CRIU helpers (filled in with the plugin).
