//! Progress across nodes: each node writes the phase it is in (`ops/GEN/phase/RANK`, under its
//! liveness lease, so a node that dies drops out of the line), and a node that waits for the
//! others shows every node's phase whenever one changes:
//! `cluster: phases: node 0 lock round 3 | node 1 at post-dump`.

use std::sync::Mutex;

use super::store::Keys;
use crate::out;

/// The phases line this node showed last.
#[derive(Default)]
pub struct Phases {
    last: Mutex<String>,
}

/// The key of node `rank`'s phase, under the operation's prefix.
pub fn key(rank: u32) -> String {
    format!("phase/{rank}")
}

impl Phases {
    /// Shows every node's phase (of `nnodes`) from `keys`, if it changed since the last line.
    pub fn show(&self, keys: &Keys, nnodes: u32) {
        let line = render(keys, nnodes);
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if *last != line {
            out::line(format!("cluster: phases: {line}"));
            *last = line;
        }
    }
}

fn render(keys: &Keys, nnodes: u32) -> String {
    (0..nnodes)
        .map(|r| {
            let phase = keys.get(&key(r)).map_or("not there".into(), |v| {
                String::from_utf8_lossy(v).into_owned()
            });
            format!("node {r} {phase}")
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_names_every_node_and_the_missing_ones() {
        let mut keys = Keys::new();
        keys.insert(key(0), b"lock round 2".to_vec());
        assert_eq!(render(&keys, 2), "node 0 lock round 2 | node 1 not there");
    }
}
