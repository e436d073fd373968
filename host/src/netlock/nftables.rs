//! CRIU's network lock with nftables, and taking it back when CRIU cannot.
//!
//! To dump or restore established TCP connections CRIU locks the network with an nftables table
//! `inet CRIU-<run id>` (criu/net.c, netfilter.c): for a tree with a network namespace of its own,
//! chains that drop every packet of that namespace but CRIU's own; for a tree in the node's
//! namespace (a job outside containers), rules that drop the packets of each dumped connection.
//! CRIU takes the lock back when a dump fails or leaves the tasks running, and after a restore; it
//! keeps it after a dump that ended the tasks (for their restore), and a CRIU that is killed never
//! takes it back: the job's connections then carry nothing, and the job stands still although it
//! runs. The guardian and `criu-gpu dump` take it back then, through libnftables as CRIU does (the
//! GPU machines have no `nft`).
//! A table is named by its run's id, so only that run's lock is ever removed. (CRIU's iptables
//! lock is one chain `CRIU` shared by every run: it is never removed here, only named.)

use std::ffi::{c_char, c_int, c_void, CString};

/// The table of CRIU run `run_id`, as CRIU names it: in a buffer of 32 bytes
/// (`nftables_get_table`), so cut to 31 characters, 21 of the run id's.
pub fn table(run_id: &str) -> String {
    let mut t = format!("inet CRIU-{run_id}");
    t.truncate(31);
    t
}

/// What became of a run's lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unlocked {
    /// The table was there and is gone now.
    Removed,
    /// No such table: the network was not locked (or already unlocked).
    NotLocked,
}

type CtxNew = unsafe extern "C" fn(u32) -> *mut c_void;
type CtxFree = unsafe extern "C" fn(*mut c_void);
type RunCmd = unsafe extern "C" fn(*mut c_void, *const c_char) -> c_int;
type BufferError = unsafe extern "C" fn(*mut c_void) -> c_int;

/// libnftables, as CRIU uses it (nftables/libnftables.h).
struct Nft {
    _lib: libloading::Library,
    ctx_new: CtxNew,
    ctx_free: CtxFree,
    run: RunCmd,
    buffer_error: BufferError,
}

impl Nft {
    fn load() -> Result<Nft, String> {
        let names = ["libnftables.so.1", "libnftables.so"];
        let lib = names
            .iter()
            // SAFETY: loading libnftables runs its initialisers, which are safe in any process.
            .find_map(|n| unsafe { libloading::Library::new(n) }.ok())
            .ok_or("libnftables is not installed")?;
        // SAFETY: the symbols are libnftables' functions of these names, whose prototypes in
        // libnftables.h are the types they are read as; the library is kept with them.
        unsafe {
            let ctx_new = *lib
                .get::<CtxNew>(b"nft_ctx_new\0")
                .map_err(|e| e.to_string())?;
            let ctx_free = *lib
                .get::<CtxFree>(b"nft_ctx_free\0")
                .map_err(|e| e.to_string())?;
            let run = *lib
                .get::<RunCmd>(b"nft_run_cmd_from_buffer\0")
                .map_err(|e| e.to_string())?;
            let buffer_error = *lib
                .get::<BufferError>(b"nft_ctx_buffer_error\0")
                .map_err(|e| e.to_string())?;
            Ok(Nft {
                _lib: lib,
                ctx_new,
                ctx_free,
                run,
                buffer_error,
            })
        }
    }

    /// Runs one nft command; whether it succeeded.
    fn command(&self, cmd: &str) -> Result<bool, String> {
        let c = CString::new(cmd).map_err(|e| e.to_string())?;
        // SAFETY: a context is made, used for one command and freed here; nft_ctx_buffer_error
        // keeps libnftables' error text off our stderr (it is not needed: the table's absence
        // is the only expected error).
        unsafe {
            let ctx = (self.ctx_new)(0);
            if ctx.is_null() {
                return Err("nft_ctx_new failed".into());
            }
            (self.buffer_error)(ctx);
            let rc = (self.run)(ctx, c.as_ptr());
            (self.ctx_free)(ctx);
            Ok(rc == 0)
        }
    }
}

/// Removes the network lock of CRIU run `run_id` in this network namespace.
pub fn unlock(run_id: &str) -> Result<Unlocked, String> {
    if run_id.is_empty() || !run_id.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
        return Err(format!("{run_id:?} is not a CRIU run id"));
    }
    let nft = Nft::load()?;
    let table = table(run_id);
    if !nft.command(&format!("list table {table}"))? {
        return Ok(Unlocked::NotLocked);
    }
    if nft.command(&format!("delete table {table}"))? {
        Ok(Unlocked::Removed)
    } else {
        Err(format!("`delete table {table}` failed"))
    }
}

/// Whether CRIU run `run_id` holds the network locked here (tests, doctor).
pub fn is_locked(run_id: &str) -> Result<bool, String> {
    Nft::load()?.command(&format!("list table {}", table(run_id)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_run_ids_name_a_table() {
        // As CRIU 4.2.1 made it on this machine (`list tables`).
        assert_eq!(
            table("0a8d4cc3-cfe5-47f9-81c2-6ee1b2ad0a61"),
            "inet CRIU-0a8d4cc3-cfe5-47f9-81"
        );
        assert!(unlock("x; flush ruleset").is_err());
        assert!(unlock("").is_err());
    }

    /// A lock made as CRIU makes it is found and removed, and a second removal finds none.
    /// Needs root and libnftables (both on this project's CI machine).
    #[test]
    fn a_criu_lock_is_removed_and_only_that_one() {
        let nft = Nft::load().unwrap_or_else(|e| {
            panic!("needs libnftables ({e}): scripts/install-criu.sh installs it")
        });
        let id = format!("00000000-0000-4000-8000-{:012x}", std::process::id());
        let other = format!("00000000-0000-4000-9000-{:012x}", std::process::id());
        // Tables only: no chains with a drop policy, so this test never cuts the machine off.
        assert!(
            nft.command(&format!("add table {}", table(&id))).unwrap(),
            "needs root (nftables tables): run the tests as root, as scripts/test.sh does"
        );
        assert!(nft
            .command(&format!("add table {}", table(&other)))
            .unwrap());
        assert!(is_locked(&id).unwrap());
        assert_eq!(unlock(&id).unwrap(), Unlocked::Removed);
        assert!(!is_locked(&id).unwrap());
        assert_eq!(unlock(&id).unwrap(), Unlocked::NotLocked);
        assert!(is_locked(&other).unwrap(), "another run's lock stays");
        assert_eq!(unlock(&other).unwrap(), Unlocked::Removed);
    }
}
