//! What the plugin shares with CRIU, checked against the pinned CRIU's headers: a C program
//! compiled with CRIU's own include paths and the `config.h` of its build prints every offset,
//! size and value the plugin relies on, and whether each function type CRIU declares is the one
//! the plugin uses; each is compared with the Rust side.
//!
//! The headers are those of the build trees `scripts/install-criu.sh` leaves (stock and patched
//! CRIU, under `$WORK`, /opt/criu-build by default; `install.sh` runs it, on CI too). The test
//! reads where from the script itself, and passes with a message only where neither tree is
//! there.

use std::collections::BTreeMap;
use std::ffi::{c_int, c_void};
use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::Command;

use super::criu::*;
use super::{hook, PluginDesc, BASE_HOOKS, ENOTSUP, HOOK_SLOTS, PLUGIN_VERSION};
use crate::core::Stage;
use crate::log::CriuLevel;

/// Where install-criu.sh leaves CRIU's build trees: `$WORK/{stock,patched}/$SRC`, with the
/// script's own default for WORK and its SRC.
fn criu_trees() -> [PathBuf; 2] {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/install-criu.sh");
    let text = std::fs::read_to_string(&script).expect("scripts/install-criu.sh");
    let value = |key: &str| -> String {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("no {key}= in {}", script.display()))
            .to_owned()
    };
    // WORK=${WORK:-/opt/criu-build}
    let default = value("WORK");
    let default = default
        .split_once(":-")
        .and_then(|(_, d)| d.strip_suffix('}'))
        .unwrap_or_else(|| panic!("WORK={default} in install-criu.sh"));
    let work = std::env::var("WORK")
        .ok()
        .filter(|w| !w.is_empty())
        .unwrap_or_else(|| default.to_owned());
    let src = value("SRC");
    ["stock", "patched"].map(|kind| Path::new(&work).join(kind).join(&src))
}

/// CRIU's name for this machine's architecture (criu/arch/NAME).
fn criu_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "x86",
        "powerpc64" => "ppc64",
        "s390x" => "s390",
        other => other,
    }
}

/// A Rust `extern "C"` function type (as `type_name` writes it) in C: `RET (ARGS)`.
fn c_function(rust: &str) -> String {
    let rest = rust
        .trim_start_matches("unsafe ")
        .strip_prefix("extern \"C\" fn(")
        .unwrap_or_else(|| panic!("not an extern \"C\" fn: {rust}"));
    let (args, ret) = rest.rsplit_once(')').unwrap();
    let ret = ret.strip_prefix(" -> ").map_or("void".to_owned(), c_type);
    let args: Vec<String> = args
        .split(", ")
        .filter(|a| !a.is_empty())
        .map(c_type)
        .collect();
    match args.is_empty() {
        true => format!("{ret} (void)"),
        false => format!("{ret} ({})", args.join(", ")),
    }
}

/// A Rust FFI type in C (LP64; `c_char` is i8 or u8 by architecture).
fn c_type(rust: &str) -> String {
    if let Some(t) = rust.strip_prefix("*const ") {
        return format!("const {} *", c_type(t));
    }
    if let Some(t) = rust.strip_prefix("*mut ") {
        return format!("{} *", c_type(t));
    }
    match rust {
        "i8" | "u8" => "char",
        "i32" => "int",
        "u32" => "unsigned int",
        "u64" => "unsigned long",
        "usize" => "size_t",
        "bool" => "_Bool",
        "..." => "...",
        t if t.ends_with("::stat") => "struct stat",
        t => panic!("no C type for {t}"),
    }
    .to_owned()
}

fn name_of<T>(_: &T) -> &'static str {
    std::any::type_name::<T>()
}

fn t<T>() -> &'static str {
    std::any::type_name::<T>()
}

/// Each function type shared with CRIU: (key, the plugin's type as Rust declares it). The
/// trampolines' types are inferred from the functions themselves.
fn functions(patched: bool, inet: bool) -> Vec<(&'static str, &'static str)> {
    use super::{checkpoint_devices, dump_ext_file, exit, handle_device_vma, init};
    use super::{
        pause_devices, restore_ext_file, resume_devices_late, update_inetsk, update_vma_map,
    };
    let mut f = vec![
        ("print_on_level", t::<PrintOnLevel>()),
        ("add_inventory_plugin", t::<AddInventoryPlugin>()),
        (
            "check_and_remove_inventory_plugin",
            t::<CheckAndRemoveInventoryPlugin>(),
        ),
        // CRIU 4.0's dont_use_freeze_cgroup, the same type, is not in 4.2's headers.
        ("set_compel_interrupt_only_mode", t::<VoidFn>()),
        ("criu_get_image_dir", t::<GetImageDir>()),
        ("desc.init", name_of(&(init as extern "C" fn(_) -> _))),
        ("desc.exit", name_of(&(exit as extern "C" fn(_, _)))),
        (
            "DUMP_EXT_FILE",
            name_of(&(dump_ext_file as extern "C" fn(_, _) -> _)),
        ),
        (
            "RESTORE_EXT_FILE",
            name_of(&(restore_ext_file as extern "C" fn(_) -> _)),
        ),
        (
            "HANDLE_DEVICE_VMA",
            name_of(&(handle_device_vma as extern "C" fn(_, _) -> _)),
        ),
        (
            "UPDATE_VMA_MAP",
            name_of(&(update_vma_map as extern "C" fn(_, _, _, _, _) -> _)),
        ),
        (
            "RESUME_DEVICES_LATE",
            name_of(&(resume_devices_late as extern "C" fn(_) -> _)),
        ),
        (
            "PAUSE_DEVICES",
            name_of(&(pause_devices as extern "C" fn(_) -> _)),
        ),
        (
            "CHECKPOINT_DEVICES",
            name_of(&(checkpoint_devices as extern "C" fn(_) -> _)),
        ),
    ];
    if patched {
        // The project's patches 0007 and 0008 (criu-plugin.h); stock CRIU has neither.
        f.push(("criu_defer_pages", t::<DeferPages>()));
        f.push(("criu_dumps_io_uring", t::<DumpsIoUring>()));
    }
    if inet {
        // Patch 0012 (criu#2841 upstream).
        f.push((
            "UPDATE_INETSK",
            name_of(&(update_inetsk as extern "C" fn(_, _, _, _) -> _)),
        ));
        f.push(("criu_plugin_max_hooks", t::<MaxHooks>()));
    }
    f
}

/// CRIU's type for `key` of [`functions`], as a C type expression: a hook's typedef, a field
/// of the descriptor, or the type of the function of that name.
fn criu_type(key: &str) -> String {
    if let Some(field) = key.strip_prefix("desc.") {
        format!("__typeof__(*((cr_plugin_desc_t *)0)->{field})")
    } else if key.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
        format!("CR_PLUGIN_HOOK__{key}_t")
    } else {
        format!("__typeof__({key})")
    }
}

/// The C program: one `key value` line for each offset, size and value, and `type.KEY 1` for
/// each function type that matches.
fn program(patched: bool, inet: bool) -> String {
    let mut c = String::from(
        r#"#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include "criu-plugin.h"
#include "cr_options.h"
#include "image.h"
#include "log.h"
#include "pid.h"
#include "pstree.h"
#include "seize.h"
#include "util.h"
#define O(k, t, f) printf(k " %zu\n", offsetof(t, f))
#define S(k, x) printf(k " %zu\n", sizeof(x))
#define V(k) printf(#k " %lld\n", (long long)(k))
int main(void) {
    O("desc.name", cr_plugin_desc_t, name);
    O("desc.init", cr_plugin_desc_t, init);
    O("desc.exit", cr_plugin_desc_t, exit);
    O("desc.version", cr_plugin_desc_t, version);
    O("desc.max_hooks", cr_plugin_desc_t, max_hooks);
    O("desc.hooks", cr_plugin_desc_t, hooks);
    S("desc.hooks[0]", ((cr_plugin_desc_t *)0)->hooks[0]);
    V(CRIU_PLUGIN_VERSION); V(CR_PLUGIN_HOOK__MAX);
    V(CR_PLUGIN_HOOK__DUMP_EXT_FILE); V(CR_PLUGIN_HOOK__RESTORE_EXT_FILE);
    V(CR_PLUGIN_HOOK__HANDLE_DEVICE_VMA); V(CR_PLUGIN_HOOK__UPDATE_VMA_MAP);
    V(CR_PLUGIN_HOOK__RESUME_DEVICES_LATE); V(CR_PLUGIN_HOOK__PAUSE_DEVICES);
    V(CR_PLUGIN_HOOK__CHECKPOINT_DEVICES);
    V(CR_PLUGIN_STAGE__DUMP); V(CR_PLUGIN_STAGE__PRE_DUMP); V(CR_PLUGIN_STAGE__RESTORE);
    V(CR_PLUGIN_STAGE_MAX);
    V(ENOTSUP);
    O("opts.final_state", struct cr_options, final_state);
    S("sizeof.final_state", opts.final_state);
    V(TASK_ALIVE); V(TASK_DEAD); V(TASK_STOPPED);
    O("pstree_item.pid", struct pstree_item, pid);
    S("sizeof.pstree_item.pid", ((struct pstree_item *)0)->pid);
    S("sizeof.root_item", root_item);
    O("pid.real", struct pid, real);
    S("sizeof.pid.real", ((struct pid *)0)->real);
    V(RUN_ID_HASH_LENGTH);
    S("sizeof.criu_run_id", criu_run_id);
    V(LOG_ERROR); V(LOG_WARN); V(LOG_INFO); V(LOG_DEBUG);
"#,
    );
    if inet {
        c.push_str("    V(CR_PLUGIN_HOOK__UPDATE_INETSK);\n");
    }
    for (key, ours) in functions(patched, inet) {
        c.push_str(&format!(
            "    printf(\"type.{key} %d\\n\", __builtin_types_compatible_p({}, {}));\n",
            criu_type(key),
            c_function(ours)
        ));
    }
    c.push_str("    return 0;\n}\n");
    c
}

/// Compiles and runs the program against `tree`'s headers; its `key value` lines.
fn criu_answers(tree: &Path, (patched, inet): (bool, bool), dir: &Path) -> BTreeMap<String, i64> {
    assert!(
        tree.join("include/common/config.h").exists(),
        "{} is not built (no include/common/config.h): run scripts/install-criu.sh",
        tree.display()
    );
    let src = dir.join("layout.c");
    std::fs::write(&src, program(patched, inet)).unwrap();
    let exe = dir.join("layout");
    let mut cc = Command::new("cc");
    // CRIU's own include paths (criu/Makefile, Makefile.compel).
    for q in ["criu/include", "include", "images", "."] {
        cc.arg("-iquote").arg(tree.join(q));
    }
    cc.arg("-iquote")
        .arg(tree.join("criu/arch").join(criu_arch()).join("include"));
    cc.arg("-I").arg(tree.join("compel/include/uapi"));
    let out = cc
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("a C compiler (cc) is needed for this test");
    assert!(
        out.status.success(),
        "compiling against {}: {}",
        tree.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&exe).output().unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_owned(), v.parse().unwrap())
        })
        .collect()
}

/// What the plugin says for each key the program prints.
fn ours() -> Vec<(&'static str, i64)> {
    let stage = |raw: i32| match Stage::from_raw(raw) {
        Some(Stage::Dump) => 0,
        Some(Stage::PreDump) => 1,
        Some(Stage::Restore) => 2,
        None => -1,
    };
    let o = |v: usize| v as i64;
    vec![
        ("desc.name", o(offset_of!(PluginDesc, name))),
        ("desc.init", o(offset_of!(PluginDesc, init))),
        ("desc.exit", o(offset_of!(PluginDesc, exit))),
        ("desc.version", o(offset_of!(PluginDesc, version))),
        ("desc.max_hooks", o(offset_of!(PluginDesc, max_hooks))),
        ("desc.hooks", o(offset_of!(PluginDesc, hooks))),
        ("desc.hooks[0]", o(size_of::<*const c_void>())),
        ("CRIU_PLUGIN_VERSION", PLUGIN_VERSION as i64),
        ("CR_PLUGIN_HOOK__DUMP_EXT_FILE", o(hook::DUMP_EXT_FILE)),
        (
            "CR_PLUGIN_HOOK__RESTORE_EXT_FILE",
            o(hook::RESTORE_EXT_FILE),
        ),
        (
            "CR_PLUGIN_HOOK__HANDLE_DEVICE_VMA",
            o(hook::HANDLE_DEVICE_VMA),
        ),
        ("CR_PLUGIN_HOOK__UPDATE_VMA_MAP", o(hook::UPDATE_VMA_MAP)),
        (
            "CR_PLUGIN_HOOK__RESUME_DEVICES_LATE",
            o(hook::RESUME_DEVICES_LATE),
        ),
        ("CR_PLUGIN_HOOK__PAUSE_DEVICES", o(hook::PAUSE_DEVICES)),
        (
            "CR_PLUGIN_HOOK__CHECKPOINT_DEVICES",
            o(hook::CHECKPOINT_DEVICES),
        ),
        // Stage::from_raw reads CRIU's values; the one past them is no stage.
        ("CR_PLUGIN_STAGE__DUMP", stage(0)),
        ("CR_PLUGIN_STAGE__PRE_DUMP", stage(1)),
        ("CR_PLUGIN_STAGE__RESTORE", stage(2)),
        ("ENOTSUP", ENOTSUP as i64),
        ("opts.final_state", o(OPTS_FINAL_STATE)),
        ("sizeof.final_state", o(size_of::<c_int>())),
        ("TASK_ALIVE", TASK_ALIVE as i64),
        ("TASK_DEAD", TASK_DEAD as i64),
        ("TASK_STOPPED", TASK_STOPPED as i64),
        ("pstree_item.pid", o(PSTREE_ITEM_PID)),
        ("sizeof.pstree_item.pid", o(size_of::<*const u8>())),
        ("sizeof.root_item", o(size_of::<*const u8>())),
        ("pid.real", o(PID_REAL)),
        ("sizeof.pid.real", o(size_of::<c_int>())),
        ("RUN_ID_HASH_LENGTH", o(RUN_ID_HASH_LENGTH)),
        ("sizeof.criu_run_id", o(RUN_ID_HASH_LENGTH)),
        ("LOG_ERROR", CriuLevel::Error as i64),
        ("LOG_WARN", CriuLevel::Warn as i64),
        ("LOG_INFO", CriuLevel::Info as i64),
        ("LOG_DEBUG", CriuLevel::Debug as i64),
    ]
}

#[test]
fn what_the_plugin_shares_with_criu_matches_the_pinned_criu_headers() {
    let all = criu_trees();
    let trees: Vec<&PathBuf> = all
        .iter()
        .filter(|t| t.join("criu/include/criu-plugin.h").exists())
        .collect();
    assert!(
        !trees.is_empty(),
        "neither of CRIU's build trees is here ({} and {}, as scripts/install-criu.sh leaves \
         them): run scripts/install-criu.sh to check the plugin's view of CRIU's structs against \
         its headers",
        all[0].display(),
        all[1].display()
    );
    let dir = tempfile::tempdir().unwrap();
    for tree in trees {
        let header = std::fs::read_to_string(tree.join("criu/include/criu-plugin.h")).unwrap();
        let patched = header.contains("criu_defer_pages");
        let inet = header.contains("CR_PLUGIN_HOOK__UPDATE_INETSK");
        let criu = criu_answers(tree, (patched, inet), dir.path());
        let get = |k: &str| -> i64 {
            *criu
                .get(k)
                .unwrap_or_else(|| panic!("{k} missing from {criu:?}"))
        };
        for (key, ours) in ours() {
            assert_eq!(get(key), ours, "{key} in {}", tree.display());
        }
        assert_eq!(
            Stage::from_raw(get("CR_PLUGIN_STAGE_MAX") as i32),
            None,
            "{}",
            tree.display()
        );
        // CRIU refuses a plugin with more hooks than CR_PLUGIN_HOOK__MAX: the descriptor
        // starts with as many as every CRIU from 4.0 on has (4.0's is 12, 4.2's 13), and offers
        // all of its slots only to a CRIU that has UPDATE_INETSK where the plugin has it.
        let max = get("CR_PLUGIN_HOOK__MAX");
        assert!(BASE_HOOKS as i64 <= max, "{}", tree.display());
        if inet {
            assert_eq!(
                get("CR_PLUGIN_HOOK__UPDATE_INETSK"),
                hook::UPDATE_INETSK as i64
            );
            assert_eq!(max, HOOK_SLOTS as i64, "{}", tree.display());
        } else {
            assert!(max <= hook::UPDATE_INETSK as i64, "{}", tree.display());
        }
        for (key, rust) in functions(patched, inet) {
            assert_eq!(
                get(&format!("type.{key}")),
                1,
                "{key}: CRIU's {} in {} is not the plugin's {} ({rust})",
                criu_type(key),
                tree.display(),
                c_function(rust)
            );
        }
    }
}
