//! Snapshots stored by content, with the real CRIU, the plugin and the simulated GPU:
//! `criu-gpu dump --store` twice of a process whose device data barely changed stores the
//! second in a fraction of the bytes; `inspect` of the store shows new and shared bytes; a
//! restore from the store goes on with its data; a damaged chunk is refused by name before
//! anything is restored; garbage collection frees what no snapshot names; two dumps into one
//! store at once both restore; a collection started while a dump writes waits for it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use gpu_ckpt_tests::criu::Criu;
use gpu_ckpt_tests::job::{criu_gpu, criu_gpu_with, text};
use gpu_ckpt_tests::*;
use serde_json::Value;

/// `criu-gpu ARGS` without CRIU (the store's own subcommands).
fn store_cmd(sim: &Sim, args: &[&str]) -> Output {
    let out = Command::new(artifact("criu-gpu"))
        .args(args)
        .envs(sim.env())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    eprintln!("criu-gpu {args:?}:\n{}{}", stdout(&out), stderr(&out));
    out
}

fn json(out: &Output) -> Value {
    assert!(out.status.success(), "{}", text(out));
    let s = stdout(out);
    // The JSON document is the last thing printed (after the progress lines).
    let at = s.find("\n{").map_or(0, |i| i + 1);
    serde_json::from_str(&s[at..]).unwrap_or_else(|e| panic!("{e}: {s}"))
}

struct Place {
    store: PathBuf,
    stage: PathBuf,
}

impl Place {
    fn new(sim: &Sim) -> Place {
        Place {
            store: sim.dir.join("store"),
            stage: sim.dir.join("stage"),
        }
    }

    fn s(&self) -> &str {
        self.store.to_str().unwrap()
    }

    /// `criu-gpu dump PID --store ... --snapshot NAME` (a snapshot: the process runs on).
    fn dump(&self, sim: &Sim, c: &Criu, pid: i32, name: &str, leave_running: bool) -> Output {
        let stage = self.stage.join(format!("dump-{name}"));
        let pid = pid.to_string();
        let mut args = vec![
            "dump",
            &pid,
            "--json",
            "--store",
            self.s(),
            "--snapshot",
            name,
        ];
        args.extend(["--stage", stage.to_str().unwrap()]);
        if leave_running {
            args.push("--leave-running");
        }
        criu_gpu(sim, c, &args, &[])
    }

    fn restore(&self, sim: &Sim, c: &Criu, name: &str) -> Output {
        let stage = self.stage.join(format!("restore-{name}"));
        criu_gpu(
            sim,
            c,
            &[
                "restore",
                "--store",
                self.s(),
                "--snapshot",
                name,
                "--stage",
                stage.to_str().unwrap(),
            ],
            &[],
        )
    }
}

fn written(out: &Output, field: &str) -> u64 {
    json(out)["written"][field].as_u64().unwrap()
}

fn app(sim: &mut Sim, name: &str, seed: &str) -> App {
    // A step rewrites 256 KiB of the 48 MiB: between two snapshots little changes.
    sim.app(
        name,
        &["--mib", "48", "--seed", seed, "--interval-ms", "300"],
    )
}

fn restored_goes_on(sim: &mut Sim, app: &App) {
    assert!(pid_alive(app.pid), "restored with its pid");
    sim.adopt(app.pid);
    assert!(app.advances(3), "{}", app.tail());
    app.assert_healthy();
}

#[test]
fn a_second_snapshot_stores_what_changed_and_restores_from_the_store() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let p = Place::new(&sim);
    let app = app(&mut sim, "app", "3");
    let first = p.dump(&sim, &c, app.pid, "one", true);
    let (first_new, total) = (written(&first, "new_bytes"), written(&first, "bytes"));
    assert!(first_new > 48 << 20, "{}", text(&first));
    let second = p.dump(&sim, &c, app.pid, "two", true);
    let second_new = written(&second, "new_bytes");
    assert!(
        (second_new as f64) < 0.15 * first_new as f64,
        "the second snapshot stored {second_new} new bytes against {first_new}"
    );
    assert!(written(&second, "bytes") >= total - (1 << 20));
    let usage = json(&store_cmd(&sim, &["inspect", "--json", p.s()]));
    let two = &usage["snapshots"][1];
    assert_eq!(two["name"], "two", "{usage}");
    assert!(two["shared_bytes"].as_u64().unwrap() > 40 << 20, "{usage}");
    let human = stdout(&store_cmd(&sim, &["store", "list", p.s()]));
    assert!(
        human.contains("shared with other snapshots") && human.contains("two"),
        "{human}"
    );

    // The first goes, its chunks with it; the second still restores.
    assert!(store_cmd(&sim, &["store", "delete", p.s(), "one"])
        .status
        .success());
    let gc = json(&store_cmd(
        &sim,
        &["store", "gc", p.s(), "--grace", "0", "--json"],
    ));
    assert!(gc["deleted_chunks"].as_u64().unwrap() > 0, "{gc}");
    signal(app.pid, nix::sys::signal::Signal::SIGKILL);
    wait_gone(app.pid);
    let out = p.restore(&sim, &c, "two");
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("read snapshot two"), "{}", text(&out));
    restored_goes_on(&mut sim, &app);
    let stage = p.stage.join("restore-two");
    assert!(stage.join("restore.log").exists() && !stage.join("pages-1.img").exists());
}

/// The key of a chunk of the largest pages image of snapshot `name`, and its name.
fn a_pages_chunk(store: &Path, name: &str) -> (PathBuf, String, String) {
    let text = std::fs::read_to_string(store.join(format!("snapshots/{name}.json"))).unwrap();
    let sealed: Value = serde_json::from_str(&text).unwrap();
    let files = sealed["body"]["entries"].as_array().unwrap();
    let pages = files
        .iter()
        .filter(|e| e["path"].as_str().unwrap().starts_with("pages-"))
        .max_by_key(|e| e["size"].as_u64().unwrap())
        .unwrap();
    let id = pages["chunks"][1][0].as_str().unwrap().to_owned();
    (
        store.join("chunks").join(&id[..2]).join(&id),
        id,
        pages["path"].as_str().unwrap().to_owned(),
    )
}

#[test]
fn a_damaged_chunk_is_refused_by_name_before_anything_is_restored() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let p = Place::new(&sim);
    let app = app(&mut sim, "app", "5");
    assert!(p.dump(&sim, &c, app.pid, "s", false).status.success());
    wait_gone(app.pid);
    let (chunk, id, file) = a_pages_chunk(&p.store, "s");
    let mut bytes = std::fs::read(&chunk).unwrap();
    let at = bytes.len() - 100;
    bytes[at] ^= 0x40;
    std::fs::write(&chunk, &bytes).unwrap();

    let out = p.restore(&sim, &c, "s");
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(
        t.contains(&id) && t.contains(&file) && t.contains("damaged"),
        "{t}"
    );
    assert!(!t.contains("running: "), "CRIU never ran: {t}");
    assert!(!pid_alive(app.pid));
    let verify = store_cmd(&sim, &["store", "verify", p.s()]);
    assert_eq!(exit_code(&verify), 1);
    assert!(stdout(&verify).contains(&id), "{}", text(&verify));
}

#[test]
fn two_dumps_into_one_store_at_once_both_restore() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let p = Place::new(&sim);
    let (a, b) = (app(&mut sim, "a", "7"), app(&mut sim, "b", "8"));
    let outs: Vec<Output> = std::thread::scope(|s| {
        let ta = s.spawn(|| p.dump(&sim, &c, a.pid, "a", false));
        let tb = s.spawn(|| p.dump(&sim, &c, b.pid, "b", false));
        vec![ta.join().unwrap(), tb.join().unwrap()]
    });
    for o in &outs {
        assert!(o.status.success(), "{}", text(o));
    }
    wait_gone(a.pid);
    wait_gone(b.pid);
    let verify = store_cmd(&sim, &["store", "verify", p.s()]);
    assert!(verify.status.success(), "{}", text(&verify));
    for (name, app) in [("a", &a), ("b", &b)] {
        let out = p.restore(&sim, &c, name);
        assert!(out.status.success(), "{}", text(&out));
        restored_goes_on(&mut sim, app);
    }
}

fn spawn_dump_held(sim: &Sim, c: &Criu, p: &Place, pid: i32, hold: &Path) -> Child {
    let stage = p.stage.join("dump-held");
    Command::new(artifact("criu-gpu"))
        .args([
            "dump",
            &pid.to_string(),
            "--store",
            p.s(),
            "--snapshot",
            "held",
        ])
        .args([
            "--stage",
            stage.to_str().unwrap(),
            "--criu",
            c.bin.to_str().unwrap(),
        ])
        .args(["--", "--lib", c.plugins.to_str().unwrap()])
        .envs(sim.env())
        .env_remove("LD_LIBRARY_PATH")
        .env("CRIU_GPU_STORE_HOLD", hold)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn a_collection_started_while_a_dump_writes_waits_and_takes_none_of_its_chunks() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let p = Place::new(&sim);
    let app = app(&mut sim, "app", "9");
    let hold = sim.dir.join("hold");
    std::fs::write(&hold, b"").unwrap();
    let dump = spawn_dump_held(&sim, &c, &p, app.pid, &hold);
    let held = sim.dir.join("hold.held");
    assert!(
        wait_until(Duration::from_secs(60), || held.exists()),
        "the dump never stored its chunks"
    );
    // Its chunks are in the store, its manifest not yet: a collection must not take them.
    let chunks = || walk_count(&p.store.join("chunks"));
    let before = chunks();
    assert!(before > 0);
    let quick = store_cmd(&sim, &["store", "gc", p.s(), "--grace", "0", "--wait", "1"]);
    assert_eq!(exit_code(&quick), 1, "{}", text(&quick));
    assert!(
        text(&quick).contains("garbage collection waited"),
        "{}",
        text(&quick)
    );
    assert_eq!(chunks(), before);
    let gc = Command::new(artifact("criu-gpu"))
        .args([
            "store",
            "gc",
            p.s(),
            "--grace",
            "0",
            "--wait",
            "60",
            "--json",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    std::fs::remove_file(&hold).unwrap();
    let dumped = finish_within(dump, Duration::from_secs(60)).expect("the dump ends");
    assert!(dumped.status.success(), "{}", text(&dumped));
    let gc = finish_within(gc, Duration::from_secs(60)).expect("the collection ends");
    let report = json(&gc);
    assert_eq!(report["deleted_chunks"], 0, "{report}");
    assert_eq!(chunks(), before);
    wait_gone(app.pid);
    let out = p.restore(&sim, &c, "held");
    assert!(out.status.success(), "{}", text(&out));
    restored_goes_on(&mut sim, &app);
}

fn walk_count(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| {
        d.flatten()
            .map(|e| {
                if e.path().is_dir() {
                    walk_count(&e.path())
                } else {
                    1
                }
            })
            .sum()
    })
}

#[test]
fn a_store_that_cannot_take_the_snapshot_refuses_before_anything_is_frozen() {
    let mut sim = Sim::start();
    let c = Criu::new(&sim);
    let p = Place::new(&sim);
    let app = app(&mut sim, "app", "11");
    assert!(p.dump(&sim, &c, app.pid, "x", true).status.success());
    let out = p.dump(&sim, &c, app.pid, "x", false);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("already holds a snapshot named x"),
        "{}",
        text(&out)
    );
    let bad = criu_gpu_with(
        &sim,
        &c,
        &[
            "dump",
            &app.pid.to_string(),
            "--store",
            p.s(),
            "--snapshot",
            "../x",
        ],
        &[],
        &[],
    );
    assert!(
        text(&bad).contains("is not a snapshot name"),
        "{}",
        text(&bad)
    );
    assert!(
        app.advances(2),
        "the process was never frozen: {}",
        app.tail()
    );
}
