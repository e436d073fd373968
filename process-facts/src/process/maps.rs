//! A process's plain memory, from `/proc/PID/maps`: where the driver's checkpoint put the device
//! memory. The checkpoint maps one private anonymous range and fills it; the restore reads it
//! and unmaps it (docs/driver-facts.md, F17). What the checkpoint added is what is plain private
//! memory after it and was not before.

use std::fs;
use std::ops::Range;

/// The unnamed private writable mappings of a process (no file, no `[heap]` or `[stack]`), as
/// sorted address ranges.
pub fn anon_writable(pid: i32) -> std::io::Result<Vec<Range<u64>>> {
    Ok(parse(&fs::read_to_string(format!("/proc/{pid}/maps"))?))
}

fn parse(maps: &str) -> Vec<Range<u64>> {
    maps.lines().filter_map(plain_range).collect()
}

fn plain_range(line: &str) -> Option<Range<u64>> {
    let mut f = line.split_ascii_whitespace();
    let (range, perms) = (f.next()?, f.next()?.as_bytes());
    let (_offset, _dev, inode) = (f.next()?, f.next()?, f.next()?);
    let named = f.next().is_some();
    if perms.get(1) != Some(&b'w') || perms.get(3) != Some(&b'p') || inode != "0" || named {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    Some(u64::from_str_radix(start, 16).ok()?..u64::from_str_radix(end, 16).ok()?)
}

/// The parts of `after` that no range of `before` covers, merged where they touch.
pub fn added(before: &[Range<u64>], after: &[Range<u64>]) -> Vec<Range<u64>> {
    let mut out: Vec<Range<u64>> = Vec::new();
    for a in after {
        let mut pieces = vec![a.clone()];
        for b in before {
            pieces = pieces
                .into_iter()
                .flat_map(|p| {
                    if b.end <= p.start || b.start >= p.end {
                        return vec![p];
                    }
                    [p.start..b.start, b.end..p.end]
                        .into_iter()
                        .filter(|r| r.start < r.end)
                        .collect()
                })
                .collect();
        }
        for p in pieces {
            match out.last_mut() {
                Some(last) if last.end == p.start => last.end = p.end,
                _ => out.push(p),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55c8609f4000-55c8609f5000 rw-p 00000000 00:00 0 
55c891223000-55c892da4000 rw-p 00000000 00:00 0                          [heap]
7f66c4e9b000-7f6726000000 rw-p 00000000 00:00 0 
7f6726000000-7f6786800000 ---p 00000000 00:00 0 
7f6786800000-7f6786a00000 rw-s 00000000 00:01 2048                       /dev/zero (deleted)
7f69a077f000-7f69a0788000 rw-p 05bca000 fe:10 42                         /usr/local/nvidia/lib64/libcuda.so.580.159.04
7ffe64bd2000-7ffe64bf4000 rw-p 00000000 00:00 0                          [stack]
";

    #[test]
    fn only_unnamed_private_writable_mappings() {
        assert_eq!(
            parse(MAPS),
            vec![
                0x55c8609f4000..0x55c8609f5000,
                0x7f66c4e9b000..0x7f6726000000
            ]
        );
    }

    #[test]
    fn what_the_checkpoint_added() {
        let before = vec![0x1000..0x3000, 0x8000..0x9000];
        // a new range, one that grew a mapping on both sides, one merged with an old one
        let after = vec![0x1000..0x4000, 0x5000..0x6000, 0x7000..0xa000];
        assert_eq!(
            added(&before, &after),
            vec![
                0x3000..0x4000,
                0x5000..0x6000,
                0x7000..0x8000,
                0x9000..0xa000
            ]
        );
        assert_eq!(added(&after, &after), vec![]);
        assert_eq!(added(&[], &before), before);
    }

    #[test]
    fn touching_pieces_merge() {
        assert_eq!(
            added(&[], &[0x1000..0x2000, 0x2000..0x3000]),
            vec![0x1000..0x3000]
        );
    }

    #[test]
    fn own_mappings_are_read() {
        let me = std::process::id() as i32;
        let ranges = anon_writable(me).unwrap();
        assert!(!ranges.is_empty());
        assert!(ranges.windows(2).all(|w| w[0].end <= w[1].start));
    }
}
