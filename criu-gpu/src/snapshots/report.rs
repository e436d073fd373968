//! The store's answers as operators read them.

use snapshot_store::{GcReport, StoreUsage, VerifyReport};

use crate::human::{bytes, rfc3339};
use crate::out;

fn at(secs: u64) -> String {
    rfc3339(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
}

/// Each snapshot: its size, what writing it added, what it shares, what only it holds.
pub fn print_usage(u: &StoreUsage) {
    let ratio = if u.stored_bytes > 0 {
        u.logical_bytes as f64 / u.stored_bytes as f64
    } else {
        0.0
    };
    out::line(format!(
        "store {}: {} snapshot(s), {} of images kept in {} ({} chunks, x{ratio:.2})",
        u.location,
        u.snapshots.len(),
        bytes(u.logical_bytes),
        bytes(u.stored_bytes),
        u.chunks
    ));
    for s in &u.snapshots {
        let w = &s.written;
        out::line(format!(
            "  {}  {} on {}: {}; written in {:.1} s: {} new ({} stored), {} found in the store; \
             now {} shared with other snapshots, {} its own ({} stored: what deleting it frees)",
            s.name,
            at(s.created),
            s.host,
            bytes(s.bytes),
            w.seconds,
            bytes(w.new_bytes),
            bytes(w.new_stored_bytes),
            bytes(w.bytes - w.new_bytes),
            bytes(s.shared_bytes),
            bytes(s.own_bytes),
            bytes(s.own_stored_bytes)
        ));
    }
    for (name, why) in &u.damaged {
        out::line(format!("  {name}: DAMAGED: {why}"));
    }
}

pub fn print_gc(r: &GcReport) {
    let verb = if r.dry_run { "would delete" } else { "deleted" };
    out::line(format!(
        "{verb} {} chunk(s) no snapshot names ({}); kept {} chunk(s) ({}) of {} snapshot(s){}{}",
        r.deleted_chunks,
        bytes(r.deleted_bytes),
        r.kept_chunks,
        bytes(r.kept_bytes),
        r.snapshots,
        if r.young_chunks > 0 {
            format!(
                "; {} unnamed chunk(s) younger than the grace period stay",
                r.young_chunks
            )
        } else {
            String::new()
        },
        if r.leftovers > 0 {
            format!("; {} leftover(s) of interrupted writes", r.leftovers)
        } else {
            String::new()
        }
    ));
}

pub fn print_verify(r: &VerifyReport) {
    for p in &r.problems {
        out::line(format!("DAMAGED: {p}"));
    }
    out::line(format!(
        "{}: {} snapshot(s), {} distinct chunk(s), {} checked",
        if r.problems.is_empty() {
            "OK".to_owned()
        } else {
            format!("{} problem(s)", r.problems.len())
        },
        r.snapshots.len(),
        r.chunks,
        bytes(r.bytes)
    ));
}
