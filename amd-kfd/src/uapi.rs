//! The amdkfd user API this crate uses (`linux/kfd_ioctl.h`): the CRIU operation ioctl, the
//! version ioctl, their argument structs and the allocation flags. Layouts are checked against
//! the system's own header by a test, so they cannot drift.

/// `KFD_IOCTL_MAJOR_VERSION` this code speaks.
pub const KFD_MAJOR: u32 = 1;
/// 1.7 added the CRIU API, 1.8 the dma-buf export of GTT buffers that copying them needs.
pub const KFD_MIN_MINOR: u32 = 8;

const IOC_WRITE: u32 = 1;
const IOC_READ: u32 = 2;
const KFD_TYPE: u32 = b'K' as u32;

const fn ioc(dir: u32, nr: u32, size: usize) -> u32 {
    (dir << 30) | ((size as u32) << 16) | (KFD_TYPE << 8) | nr
}

/// `struct kfd_ioctl_get_version_args`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GetVersionArgs {
    pub major_version: u32,
    pub minor_version: u32,
}

/// `enum kfd_criu_op`.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CriuOp {
    /// Counts what the process holds and evicts (pauses) its queues.
    ProcessInfo = 0,
    /// Fills the device and buffer buckets and the private data; queues must be paused.
    Checkpoint = 1,
    /// Restarts the evicted queues; always follows a successful PROCESS_INFO.
    Unpause = 2,
    /// In the restored process: recreates buffers, queues and events.
    Restore = 3,
    /// From CRIU, once the process's mappings are in place: starts it on the GPU.
    Resume = 4,
}

/// `struct kfd_ioctl_criu_args` (56 bytes: 4 of tail padding, explicit here).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CriuArgs {
    pub devices: u64,
    pub bos: u64,
    pub priv_data: u64,
    pub priv_data_size: u64,
    pub num_devices: u32,
    pub num_bos: u32,
    pub num_objects: u32,
    pub pid: u32,
    pub op: u32,
    pub pad: u32,
}

/// `struct kfd_criu_device_bucket`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceBucket {
    /// The gpu_id the application was started with (kept across restores).
    pub user_gpu_id: u32,
    /// The gpu_id of the device now.
    pub actual_gpu_id: u32,
    /// Restore: an open render node of that GPU.
    pub drm_fd: u32,
    pub pad: u32,
}

/// `struct kfd_criu_bo_bucket`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BoBucket {
    /// GPU virtual address.
    pub addr: u64,
    pub size: u64,
    /// mmap offset at checkpoint (render node fake offset, or /dev/kfd doorbell/MMIO offset).
    pub offset: u64,
    /// Restore: the new mmap offset.
    pub restored_offset: u64,
    /// The user gpu_id owning the buffer.
    pub gpu_id: u32,
    pub alloc_flags: u32,
    /// A dma-buf fd for VRAM/GTT buffers; `INVALID_FD` otherwise.
    pub dmabuf_fd: u32,
    pub pad: u32,
}

pub const INVALID_FD: u32 = 0xffff_ffff;

pub const AMDKFD_IOC_GET_VERSION: u32 = ioc(IOC_READ, 0x01, std::mem::size_of::<GetVersionArgs>());
pub const AMDKFD_IOC_CRIU_OP: u32 =
    ioc(IOC_READ | IOC_WRITE, 0x22, std::mem::size_of::<CriuArgs>());

/// `KFD_IOC_ALLOC_MEM_FLAGS_*`.
pub mod alloc {
    pub const VRAM: u32 = 1 << 0;
    pub const GTT: u32 = 1 << 1;
    pub const USERPTR: u32 = 1 << 2;
    pub const DOORBELL: u32 = 1 << 3;
    pub const MMIO_REMAP: u32 = 1 << 4;
    pub const WRITABLE: u32 = 1 << 31;
    pub const EXECUTABLE: u32 = 1 << 30;
    pub const PUBLIC: u32 = 1 << 29;

    /// Buffers whose contents the plugin saves (the rest is process memory or hardware).
    pub fn has_contents(flags: u32) -> bool {
        flags & (VRAM | GTT) != 0
    }

    /// Buffers the process maps through a device file, whose mapping moves on restore.
    pub fn is_device_mapped(flags: u32) -> bool {
        flags & (VRAM | GTT | DOORBELL | MMIO_REMAP) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};
    use std::process::Command;

    #[test]
    fn sizes_and_codes_match_the_documented_abi() {
        assert_eq!(size_of::<CriuArgs>(), 56);
        assert_eq!(size_of::<DeviceBucket>(), 16);
        assert_eq!(size_of::<BoBucket>(), 48);
        assert_eq!(AMDKFD_IOC_CRIU_OP, 0xC038_4B22);
        assert_eq!(AMDKFD_IOC_GET_VERSION, 0x8008_4B01);
    }

    /// Compiles a C program against the system's `linux/kfd_ioctl.h` (Debian: linux-libc-dev)
    /// and compares every size, offset and request code with ours.
    #[test]
    fn layouts_match_the_system_header() {
        if !std::path::Path::new("/usr/include/linux/kfd_ioctl.h").exists() {
            panic!("linux/kfd_ioctl.h is missing: install linux-libc-dev (Debian/Ubuntu)");
        }
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("kfd.c");
        std::fs::write(
            &src,
            r#"#include <stdio.h>
#include <stddef.h>
#include <linux/kfd_ioctl.h>
#define S(t) printf(#t " size %zu\n", sizeof(struct t))
#define O(t, f) printf(#t "." #f " %zu\n", offsetof(struct t, f))
int main(void) {
    S(kfd_ioctl_criu_args); S(kfd_criu_device_bucket); S(kfd_criu_bo_bucket);
    S(kfd_ioctl_get_version_args);
    O(kfd_ioctl_criu_args, devices); O(kfd_ioctl_criu_args, bos);
    O(kfd_ioctl_criu_args, priv_data); O(kfd_ioctl_criu_args, priv_data_size);
    O(kfd_ioctl_criu_args, num_devices); O(kfd_ioctl_criu_args, num_bos);
    O(kfd_ioctl_criu_args, num_objects); O(kfd_ioctl_criu_args, pid); O(kfd_ioctl_criu_args, op);
    O(kfd_criu_device_bucket, user_gpu_id); O(kfd_criu_device_bucket, actual_gpu_id);
    O(kfd_criu_device_bucket, drm_fd);
    O(kfd_criu_bo_bucket, addr); O(kfd_criu_bo_bucket, size); O(kfd_criu_bo_bucket, offset);
    O(kfd_criu_bo_bucket, restored_offset); O(kfd_criu_bo_bucket, gpu_id);
    O(kfd_criu_bo_bucket, alloc_flags); O(kfd_criu_bo_bucket, dmabuf_fd);
    printf("AMDKFD_IOC_CRIU_OP %lu\n", (unsigned long)AMDKFD_IOC_CRIU_OP);
    printf("AMDKFD_IOC_GET_VERSION %lu\n", (unsigned long)AMDKFD_IOC_GET_VERSION);
    printf("op %d %d %d %d %d\n", KFD_CRIU_OP_PROCESS_INFO, KFD_CRIU_OP_CHECKPOINT,
           KFD_CRIU_OP_UNPAUSE, KFD_CRIU_OP_RESTORE, KFD_CRIU_OP_RESUME);
    printf("flags %u %u %u %u %u %u %u %u\n", KFD_IOC_ALLOC_MEM_FLAGS_VRAM,
           KFD_IOC_ALLOC_MEM_FLAGS_GTT, KFD_IOC_ALLOC_MEM_FLAGS_USERPTR,
           KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL, KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP,
           KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE, KFD_IOC_ALLOC_MEM_FLAGS_EXECUTABLE,
           KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC);
    return 0;
}
"#,
        )
        .unwrap();
        // The header includes <drm/drm.h> only for kernel types and ioctl macros; Debian ships
        // that file in libdrm-dev, so a two-line stand-in keeps the test on linux-libc-dev alone.
        std::fs::create_dir_all(dir.path().join("drm")).unwrap();
        std::fs::write(
            dir.path().join("drm/drm.h"),
            "#include <linux/types.h>\n#include <linux/ioctl.h>\n",
        )
        .unwrap();
        let exe = dir.path().join("kfd");
        let cc = Command::new("cc")
            .arg("-I")
            .arg(dir.path())
            .arg(&src)
            .arg("-o")
            .arg(&exe)
            .output()
            .expect("a C compiler (cc) is needed for this test");
        assert!(
            cc.status.success(),
            "{}",
            String::from_utf8_lossy(&cc.stderr)
        );
        let out = Command::new(&exe).output().unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let get = |key: &str| -> u64 {
            text.lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
                .unwrap_or_else(|| panic!("{key} missing in {text}"))
                .parse()
                .unwrap()
        };
        // The kernel's struct has implicit tail padding; ours names it.
        assert_eq!(
            get("kfd_ioctl_criu_args size"),
            size_of::<CriuArgs>() as u64
        );
        assert_eq!(
            get("kfd_criu_device_bucket size"),
            size_of::<DeviceBucket>() as u64
        );
        assert_eq!(get("kfd_criu_bo_bucket size"), size_of::<BoBucket>() as u64);
        assert_eq!(
            get("kfd_ioctl_get_version_args size"),
            size_of::<GetVersionArgs>() as u64
        );
        for (field, ours) in [
            ("devices", offset_of!(CriuArgs, devices)),
            ("bos", offset_of!(CriuArgs, bos)),
            ("priv_data", offset_of!(CriuArgs, priv_data)),
            ("priv_data_size", offset_of!(CriuArgs, priv_data_size)),
            ("num_devices", offset_of!(CriuArgs, num_devices)),
            ("num_bos", offset_of!(CriuArgs, num_bos)),
            ("num_objects", offset_of!(CriuArgs, num_objects)),
            ("pid", offset_of!(CriuArgs, pid)),
            ("op", offset_of!(CriuArgs, op)),
        ] {
            assert_eq!(
                get(&format!("kfd_ioctl_criu_args.{field}")),
                ours as u64,
                "{field}"
            );
        }
        for (field, ours) in [
            ("user_gpu_id", offset_of!(DeviceBucket, user_gpu_id)),
            ("actual_gpu_id", offset_of!(DeviceBucket, actual_gpu_id)),
            ("drm_fd", offset_of!(DeviceBucket, drm_fd)),
        ] {
            assert_eq!(
                get(&format!("kfd_criu_device_bucket.{field}")),
                ours as u64,
                "{field}"
            );
        }
        for (field, ours) in [
            ("addr", offset_of!(BoBucket, addr)),
            ("size", offset_of!(BoBucket, size)),
            ("offset", offset_of!(BoBucket, offset)),
            ("restored_offset", offset_of!(BoBucket, restored_offset)),
            ("gpu_id", offset_of!(BoBucket, gpu_id)),
            ("alloc_flags", offset_of!(BoBucket, alloc_flags)),
            ("dmabuf_fd", offset_of!(BoBucket, dmabuf_fd)),
        ] {
            assert_eq!(
                get(&format!("kfd_criu_bo_bucket.{field}")),
                ours as u64,
                "{field}"
            );
        }
        assert_eq!(get("AMDKFD_IOC_CRIU_OP"), AMDKFD_IOC_CRIU_OP as u64);
        assert_eq!(get("AMDKFD_IOC_GET_VERSION"), AMDKFD_IOC_GET_VERSION as u64);
        let ops = text.lines().find_map(|l| l.strip_prefix("op ")).unwrap();
        assert_eq!(ops, "0 1 2 3 4");
        assert_eq!(CriuOp::Resume as u32, 4);
        let flags: Vec<u32> = text
            .lines()
            .find_map(|l| l.strip_prefix("flags "))
            .unwrap()
            .split(' ')
            .map(|v| v.parse().unwrap())
            .collect();
        assert_eq!(
            flags,
            [
                alloc::VRAM,
                alloc::GTT,
                alloc::USERPTR,
                alloc::DOORBELL,
                alloc::MMIO_REMAP,
                alloc::WRITABLE,
                alloc::EXECUTABLE,
                alloc::PUBLIC
            ]
        );
    }
}
