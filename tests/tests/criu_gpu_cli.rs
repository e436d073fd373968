//! `criu-gpu check`, `inspect`, `image` and `doctor` on a checkpoint made by the real CRIU with
//! the plugin and the simulated GPU; the old `criu-gpu-check` name; output into a closed pipe.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use gpu_ckpt_tests::criu::{assert_ok, Criu};
use gpu_ckpt_tests::*;
use serde_json::Value;

fn run(program: &str, args: &[&str], sim: &Sim) -> Output {
    Command::new(artifact(program))
        .args(args)
        .envs(sim.env())
        .env("CRIU_GPU_CONFIG", "/nonexistent")
        .output()
        .unwrap()
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", stdout(out), stderr(out)))
}

/// A GPU process dumped (and left running) into `dir`.
fn dumped(sim: &mut Sim, dir: &Path) {
    let app = sim.app("app", &["--mib", "16"]);
    let c = Criu::new(sim);
    assert_ok(
        &c.dump(sim, app.pid, dir, &["--leave-running"], &[]),
        dir,
        "dump.log",
    );
}

#[test]
fn inspect_and_check_tell_what_a_checkpoint_holds_and_whether_it_fits() {
    let mut sim = Sim::start();
    let images = sim.dir.join("img");
    dumped(&mut sim, &images);
    let dir = images.to_str().unwrap();
    let uuid = sim.gpus()[0].0.clone();

    let r = json(&run("criu-gpu", &["inspect", "--json", dir], &sim));
    assert_eq!(r["format"], "image-directory");
    assert!(r["criu_version"].as_str().unwrap().starts_with('4'), "{r}");
    let cuda = &r["gpu"]["cuda"];
    assert_eq!(cuda["processes"][0]["comm"], "cuda-sim-app", "{r}");
    assert_eq!(cuda["processes"][0]["state"], "running");
    assert_eq!(cuda["gpus"][0]["uuid"], uuid.as_str());
    assert_eq!(cuda["memory_per_gpu"][0]["memory"], 16 << 20, "{r}");
    assert!(cuda["driver"]["simulated"].is_string());
    assert!(
        r["images"]["memory_bytes"].as_u64().unwrap() >= 16 << 20,
        "the device data is in the pages: {r}"
    );
    assert_eq!(r["this_node"]["can_restore"], true, "{r}");
    let dump = &r["gpu"]["timings"][0];
    assert_eq!(dump["command"], "dump", "{r}");
    let phase = |name: &str| {
        dump["phases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no {name} phase: {r}"))
    };
    assert_eq!(phase("checkpoint")["bytes"], 16 << 20, "{r}");
    assert_eq!(phase("lock")["processes"], 1, "{r}");
    let human = run("criu-gpu", &["inspect", dir], &sim);
    assert_eq!(exit_code(&human), 0);
    for want in [
        "CRIU 4.",
        "GPU memory",
        "16.00 MiB",
        "OK: can restore it",
        "dump: lock",
    ] {
        assert!(stdout(&human).contains(want), "{want}: {}", stdout(&human));
    }

    // The same images as a CRI-O checkpoint image, written by `criu-gpu image`.
    let archive = sim.dir.join("ckpt.tar");
    let ok = Command::new("tar")
        .arg("-C")
        .arg(&sim.dir)
        .arg("-cf")
        .arg(&archive)
        .arg("img")
        .status()
        .unwrap();
    assert!(ok.success());
    let layout = sim.dir.join("oci");
    let out = run(
        "criu-gpu",
        &[
            "image",
            archive.to_str().unwrap(),
            "--container",
            "app",
            "--output",
            layout.to_str().unwrap(),
        ],
        &sim,
    );
    assert_eq!(exit_code(&out), 0, "{}", stderr(&out));
    let r = json(&run(
        "criu-gpu",
        &["inspect", "--json", layout.to_str().unwrap()],
        &sim,
    ));
    assert_eq!(r["format"], "oci-image");
    assert_eq!(
        r["annotations"]["io.kubernetes.cri-o.annotations.checkpoint.name"],
        "app"
    );
    assert_eq!(
        r["gpu"]["cuda"]["memory_per_gpu"][0]["memory"],
        16 << 20,
        "{r}"
    );

    // check, under both names; then on a node with other GPUs.
    for program in ["criu-gpu-check", "criu-gpu"] {
        let args: &[&str] = if program == "criu-gpu" {
            &["check", dir]
        } else {
            &[dir]
        };
        let out = run(program, args, &sim);
        assert_eq!(exit_code(&out), 0, "{}{}", stdout(&out), stderr(&out));
        assert!(
            stdout(&out).contains("checkpoint: CUDA process")
                && stdout(&out).contains("OK: this node can restore it"),
            "{}",
            stdout(&out)
        );
    }
    sim.swap_gpus(SimSpec {
        seed: "elsewhere",
        ..SimSpec::default()
    });
    let out = run("criu-gpu", &["check", layout.to_str().unwrap()], &sim);
    assert_eq!(exit_code(&out), 1);
    assert!(
        stdout(&out).contains("REFUSED:") && stdout(&out).contains("is not on this machine"),
        "{}",
        stdout(&out)
    );
    let r = json(&run("criu-gpu", &["check", "--json", dir], &sim));
    assert_eq!(r["can_restore"], false);
    assert!(r["reason"]
        .as_str()
        .unwrap()
        .contains("CRIU_GPU_DEVICE_MAP"));
    let out = run("criu-gpu-check", &["/nonexistent"], &sim);
    assert_eq!(exit_code(&out), 2, "unreadable input: {}", stderr(&out));
}

/// Podman exports `.tar.zst` by default (and `--compress gzip` a `.tar.gz`): `check`, `inspect`
/// and `image` read both in this process, on a node without the `zstd` and `gzip` programs (none
/// on PATH here).
#[test]
fn compressed_archives_are_read_without_the_zstd_or_gzip_programs() {
    let mut sim = Sim::start();
    let images = sim.dir.join("img");
    dumped(&mut sim, &images);
    let mut tar = tar::Builder::new(Vec::new());
    tar.append_dir_all("checkpoint", &images).unwrap();
    let tar = tar.into_inner().unwrap();
    let zst = sim.dir.join("ckpt.tar.zst");
    std::fs::write(&zst, zstd::stream::encode_all(&tar[..], 3).unwrap()).unwrap();
    let gz = sim.dir.join("ckpt.tar.gz");
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut enc, &tar).unwrap();
    std::fs::write(&gz, enc.finish().unwrap()).unwrap();
    let bare = |args: &[&str]| {
        let out = Command::new(artifact("criu-gpu"))
            .args(args)
            .envs(sim.env())
            .env("CRIU_GPU_CONFIG", "/nonexistent")
            .env("PATH", "/nonexistent")
            .output()
            .unwrap();
        assert!(
            !stderr(&out).contains("is not installed"),
            "{}",
            stderr(&out)
        );
        out
    };
    for archive in [&zst, &gz] {
        let a = archive.to_str().unwrap();
        let r = json(&bare(&["inspect", "--json", a]));
        assert_eq!(
            r["gpu"]["cuda"]["memory_per_gpu"][0]["memory"],
            16 << 20,
            "{a}: {r}"
        );
        let out = bare(&["check", a]);
        assert_eq!(exit_code(&out), 0, "{a}: {}{}", stdout(&out), stderr(&out));
        assert!(stdout(&out).contains("OK: this node can restore it"), "{a}");
    }
    let layout = sim.dir.join("oci");
    let out = bare(&[
        "image",
        zst.to_str().unwrap(),
        "--container",
        "app",
        "--output",
        layout.to_str().unwrap(),
    ]);
    assert_eq!(exit_code(&out), 0, "{}", stderr(&out));
    let r = json(&bare(&["inspect", "--json", layout.to_str().unwrap()]));
    assert_eq!(r["format"], "oci-image", "{r}");
    assert_eq!(
        r["gpu"]["cuda"]["memory_per_gpu"][0]["memory"],
        16 << 20,
        "{r}"
    );
}

#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    let mut sim = Sim::start();
    let images = sim.dir.join("img");
    dumped(&mut sim, &images);
    for args in [
        vec!["inspect", images.to_str().unwrap()],
        vec!["doctor"],
        vec!["--help"],
    ] {
        let mut child = Command::new(artifact("criu-gpu"))
            .args(&args)
            .envs(sim.env())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take()); // `| head -0`
        let out = child.wait_with_output().unwrap();
        assert!(
            !stderr(&out).contains("panicked"),
            "{args:?}: {}",
            stderr(&out)
        );
        assert!(
            exit_code(&out) == 0 || args[0] == "doctor",
            "{args:?}: {}",
            stderr(&out)
        );
    }
}

#[test]
fn doctor_reports_each_check_and_names_empty_library_paths() {
    let sim = Sim::start();
    let r = json(&run("criu-gpu", &["doctor", "--json"], &sim));
    let checks = r["checks"].as_array().unwrap();
    let find = |name: &str| {
        checks
            .iter()
            .find(|c| c["check"] == name)
            .unwrap_or_else(|| panic!("{name}: {r}"))
    };
    assert_eq!(find("criu")["status"], "ok", "{r}");
    assert_eq!(
        find("driver")["status"],
        "warn",
        "the simulated driver is flagged: {r}"
    );
    assert!(find("driver")["fix"]
        .as_str()
        .unwrap()
        .contains("SIMULATED"));
    assert_eq!(find("GPU")["status"], "ok");
    for c in checks {
        if c["status"] != "ok" {
            assert!(c["fix"].is_string(), "every problem has a fix: {c}");
        }
    }
    let out = run("criu-gpu", &["doctor", "--driver", ""], &sim);
    assert_eq!(exit_code(&out), 2);
    assert!(
        stderr(&out).contains("--driver was given an empty path"),
        "{}",
        stderr(&out)
    );
    let out = run(
        "criu-gpu",
        &[
            "doctor",
            "--json",
            "--nvml",
            "/nonexistent/libnvidia-ml.so.1",
        ],
        &sim,
    );
    let r = json(&out);
    assert_eq!(exit_code(&out), 1, "{r}");
    let gpus = r["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "GPUs")
        .unwrap();
    assert_eq!(gpus["status"], "fail");
    assert!(gpus["fix"].as_str().unwrap().contains("--nvml"), "{gpus}");
}

#[test]
fn runtime_config_writes_the_lock_this_node_can_take_and_leaves_own_lines_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (runc, crun) = (dir.path().join("runc.conf"), dir.path().join("crun.conf"));
    std::fs::write(&crun, "timeout 900\nnetwork-lock skip\n").unwrap();
    let criu = gpu_ckpt_tests::criu::criu_binary();
    let run = |extra: &[&str]| {
        Command::new(artifact("criu-gpu"))
            .arg("runtime-config")
            .arg("--criu")
            .arg(&criu)
            .args(extra)
            .arg(&runc)
            .arg(&crun)
            .output()
            .unwrap()
    };
    let out = run(&["--json"]);
    assert_eq!(exit_code(&out), 0, "{}{}", stdout(&out), stderr(&out));
    let r = json(&out);
    // What this node's CRIU says, asked directly.
    let nft = Command::new(&criu)
        .args(["check", "--feature", "network_lock_nftables"])
        .output()
        .unwrap()
        .status
        .success();
    let want = if nft { "nftables" } else { "iptables" };
    assert_eq!(r["choice"], want, "{r}");
    assert_eq!(r["files"][0]["action"], "created", "{r}");
    assert_eq!(r["files"][1]["action"], "own", "{r}");
    let text = std::fs::read_to_string(&runc).unwrap();
    assert!(
        text.contains("timeout 600"),
        "the project's settings: {text}"
    );
    assert!(
        text.ends_with(&format!("\nnetwork-lock {want}\n")),
        "{text}"
    );
    assert_eq!(
        std::fs::read_to_string(&crun).unwrap(),
        "timeout 900\nnetwork-lock skip\n"
    );
    // CRIU reads the file it wrote.
    let check = Command::new(&criu)
        .arg("--config")
        .arg(&runc)
        .arg("check")
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", stderr(&check));
    let out = run(&[]);
    assert!(
        stdout(&out).contains("unchanged"),
        "a second run changes nothing: {}",
        stdout(&out)
    );
}

/// `criu-gpu thp -- CMD` runs CMD with huge pages at `always` and puts the node's policy back
/// after, through the plugin's own raise and put-back (what bench-criu.sh's ours-thp uses).
#[test]
fn thp_runs_a_command_with_huge_pages_and_puts_the_policy_back() {
    let knob = "/sys/kernel/mm/transparent_hugepage/enabled";
    let before = std::fs::read_to_string(knob)
        .unwrap_or_else(|e| panic!("needs transparent huge pages ({knob}: {e})"));
    // Dumps of other tests may hold the policy raised for a moment: wait for it to be free.
    let held = || criu_gpu_host::thp::Thp::default().state().holders;
    assert!(wait_until(std::time::Duration::from_secs(60), || held().is_empty()));
    let before = std::fs::read_to_string(knob).unwrap_or(before);
    let out = Command::new(artifact("criu-gpu"))
        .args(["thp", "--", "cat", knob])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("[always]"), "{}", stdout(&out));
    assert!(wait_until(std::time::Duration::from_secs(60), || held().is_empty()));
    assert_eq!(std::fs::read_to_string(knob).unwrap(), before);
}
