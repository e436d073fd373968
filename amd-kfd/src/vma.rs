//! UPDATE_VMA_MAP: after a restore, buffers the process mapped through a device file have new
//! mmap offsets (and maybe another render node); CRIU asks, per mapping, where it now goes.

use std::os::fd::RawFd;

/// One mapping to move: (address, offset at dump) -> new offset, and the fd to map it through
/// (a render node the restore opened), if not the path CRIU reopens itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remap {
    pub addr: u64,
    pub old_offset: u64,
    pub new_offset: u64,
    pub render_fd: Option<RawFd>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Remaps(pub Vec<Remap>);

/// `//dev//kfd` -> `/dev/kfd`.
fn normalise(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for c in path.chars() {
        if !(c == '/' && out.ends_with('/')) {
            out.push(c);
        }
    }
    out
}

impl Remaps {
    /// The remap for a mapping, if it is a KFD or render-node mapping this restore moved.
    pub fn lookup(&self, path: &str, addr: u64, old_offset: u64) -> Option<Remap> {
        let p = normalise(path);
        if p != "/dev/kfd" && !p.starts_with("/dev/dri/renderD") {
            return None;
        }
        self.0
            .iter()
            .find(|r| r.addr == addr && r.old_offset == old_offset)
            .copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_device_mappings_with_a_known_address_and_offset_move() {
        let r = Remaps(vec![
            Remap {
                addr: 0x1000,
                old_offset: 0x40,
                new_offset: 0x80,
                render_fd: Some(9),
            },
            Remap {
                addr: 0x2000,
                old_offset: 0x50,
                new_offset: 0x90,
                render_fd: None,
            },
        ]);
        assert_eq!(
            r.lookup("/dev/dri/renderD128", 0x1000, 0x40)
                .unwrap()
                .new_offset,
            0x80
        );
        assert_eq!(
            r.lookup("//dev//kfd", 0x2000, 0x50).unwrap().render_fd,
            None
        );
        assert!(r.lookup("/dev/kfd", 0x2000, 0x51).is_none());
        assert!(r.lookup("/tmp/file", 0x1000, 0x40).is_none());
    }
}
