//! `driver-call OP PID [TIMEOUT_MS]`: one call of the driver's checkpoint API, straight through
//! the library, without the checks `cuda-checkpoint-ctl` makes first (it refuses a process
//! whose driver thread cannot run): what the driver itself does, for the tests of
//! docs/driver-facts.md. OP: state, restore-tid, lock, checkpoint, restore, unlock. Prints the
//! answer; exits with the CUDA error code (modulo 256), as `cuda-checkpoint` does.

use std::time::Duration;

use cuda_checkpoint_ctl::driver::{DeviceMap, Driver, LIBCUDA_ENV};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage =
        "usage: driver-call state|restore-tid|lock|checkpoint|restore|unlock PID [TIMEOUT_MS]";
    let (Some(op), Some(pid)) = (args.first(), args.get(1).and_then(|p| p.parse().ok())) else {
        panic!("{usage}");
    };
    let timeout = args
        .get(2)
        .and_then(|t| t.parse().ok())
        .map(Duration::from_millis);
    let library = std::env::var(LIBCUDA_ENV).ok();
    let driver = Driver::load(library.as_deref()).unwrap_or_else(|e| panic!("{e}"));
    let answer = match op.as_str() {
        "state" => driver.state(pid).map(|s| s.to_string()),
        "restore-tid" => driver.restore_thread_id(pid).map(|t| t.to_string()),
        "lock" => driver.lock(pid, timeout).map(|()| String::new()),
        "checkpoint" => driver.checkpoint(pid).map(|()| String::new()),
        "restore" => driver
            .restore(pid, &DeviceMap::default())
            .map(|()| String::new()),
        "unlock" => driver.unlock(pid).map(|()| String::new()),
        _ => panic!("{usage}"),
    };
    match answer {
        Ok(text) => println!("{text}"),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(e.code as i32);
        }
    }
}
