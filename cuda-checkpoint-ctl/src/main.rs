//! `cuda-checkpoint-ctl`: NVIDIA's `cuda-checkpoint` command line, and more.
//!
//! With `--pid` it behaves like `cuda-checkpoint` (same operations, output and exit status), so
//! CRIU's upstream CUDA plugin can run it as `cuda-checkpoint` from PATH. With `--tree`,
//! `--cgroup` or `--all` it acts on every CUDA process found there, all at once. The work is
//! done by the library; this file parses, calls and prints.

mod cli;

fn main() {
    std::process::exit(cli::run(std::env::args_os()));
}
