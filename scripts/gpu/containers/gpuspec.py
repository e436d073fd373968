"""gpuspec.py: the GPU of scripts/gpu/containers/run.sh as the container runtimes take it.

One description of the node's GPUs (device nodes, driver libraries, environment) written as a
CDI spec, the way NVIDIA's container toolkit writes one (`nvidia-ctk cdi generate`), and the
same edits for the runtimes that do not read CDI: `ctr run` flags (containerd 1.6's ctr has no
CDI) and a runc bundle's config.json (what containerd and CRI-O hand runc).

What differs from the toolkit's spec, on purpose (the GPU machines have no toolkit):
- no hooks: the toolkit mounts each driver library under its full version name and runs
  `nvidia-ctk hook create-symlinks` (libcuda.so.1 -> libcuda.so.580...) and `update-ldcache`;
  here every library is bind-mounted under each name it has in the driver's directory
  (/usr/local/nvidia/lib64 on the GPU machines), at the same path in the container, and
  LD_LIBRARY_PATH names that directory (as NVIDIA's CUDA images do);
- only the compute libraries (libcuda, libcudadebugger, libnvidia-ml, -ptxjitcompiler, -nvvm,
  -gpucomp, -cfg): no graphics, video, OpenCL or nvidia-smi and no firmware mounts;
- NVIDIA_VISIBLE_DEVICES=void as the toolkit sets it (its legacy hook then does nothing).
The devices are named as the toolkit names them: by index ("0"), by UUID ("GPU-...") and "all".
On the simulated GPU (--sim) the "device nodes" are made up (char 195:N as the real ones),
created in the container by the runtime and never opened; the simulated driver is a library
and a socket, mounted in the same way.

  gpuspec.py cdi OUT --kind KIND (--gpu DRIVER_DIR | --sim GPUS_JSON LIBDIR SOCKDIR)
  gpuspec.py ctr-args SPEC DEVICE         one argument per line, for ctr run
  gpuspec.py runc-bundle CONFIG SPEC DEVICE --rootfs DIR [--bind SRC:DST[:ro]]... \
             [--annotation K=V]... [--env K=V]... -- ARGS...
"""

import argparse
import glob
import json
import os
import re
import subprocess
import sys

COMPUTE_LIBS = [
    "libcuda.so",
    "libcudadebugger.so",
    "libnvidia-ml.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-nvvm.so",
    "libnvidia-gpucomp.so",
    "libnvidia-cfg.so",
]
CONTAINER_LIB_DIR = "/usr/local/nvidia/lib64"
COMMON_NODES = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"]


def real_gpus():
    """(index, uuid, minor) of each GPU: nvidia-smi, and the minor from the driver's /proc."""
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout
    minors = {}
    for info in glob.glob("/proc/driver/nvidia/gpus/*/information"):
        bus = os.path.basename(os.path.dirname(info)).lower()
        m = re.search(r"Device Minor:\s*(\d+)", open(info).read())
        if m:
            minors[bus[-7:]] = int(m.group(1))  # "18:00.0": the domain is spelled two ways
    gpus = []
    for line in out.strip().splitlines():
        index, uuid, bus = [f.strip() for f in line.split(",")]
        minor = minors.get(bus.lower()[-7:])
        if minor is None:
            q = subprocess.run(["nvidia-smi", "-q", "-i", index], capture_output=True, text=True, timeout=60).stdout
            m = re.search(r"Minor Number\s*:\s*(\d+)", q)
            minor = int(m.group(1)) if m else int(index)
        gpus.append((int(index), uuid, minor))
    return gpus


def cdi(args):
    devices, common = [], {"env": ["NVIDIA_VISIBLE_DEVICES=void", f"LD_LIBRARY_PATH={CONTAINER_LIB_DIR}"]}
    if args.gpu:
        gpus = real_gpus()
        node = lambda minor: {"path": f"/dev/nvidia{minor}"}  # noqa: E731 (the runtime stats it)
        common["deviceNodes"] = [{"path": p} for p in COMMON_NODES if os.path.exists(p)]
        mounts = []
        for name in sorted(os.listdir(args.gpu)):
            if any(name.startswith(p) for p in COMPUTE_LIBS):
                host = os.path.realpath(os.path.join(args.gpu, name))
                if os.path.isfile(host):
                    mounts.append({"hostPath": host, "containerPath": f"{CONTAINER_LIB_DIR}/{name}",
                                   "options": ["ro", "nosuid", "nodev", "bind"]})
        common["mounts"] = mounts
    else:
        gpus_json, libdir, sockdir = args.sim
        listed = json.load(open(gpus_json))["gpus"]
        gpus = [(g["index"], g["uuid"], g["index"]) for g in listed]
        node = lambda minor: {"path": f"/dev/nvidia{minor}", "type": "c", "major": 195, "minor": minor}  # noqa: E731
        common["deviceNodes"] = [
            {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255},
            {"path": "/dev/nvidia-uvm", "type": "c", "major": 235, "minor": 0},
        ]
        common["mounts"] = [
            {"hostPath": os.path.join(libdir, "libcuda.so.1"), "containerPath": f"{CONTAINER_LIB_DIR}/libcuda.so.1",
             "options": ["ro", "nosuid", "nodev", "bind"]},
            {"hostPath": os.path.join(libdir, "libnvidia-ml.so.1"),
             "containerPath": f"{CONTAINER_LIB_DIR}/libnvidia-ml.so.1", "options": ["ro", "nosuid", "nodev", "bind"]},
            {"hostPath": sockdir, "containerPath": "/run/cuda-sim", "options": ["rbind", "rw"]},
        ]
        common["env"].append("CUDA_SIM_SOCKET=/run/cuda-sim/gpud.sock")
    for index, uuid, minor in gpus:
        for name in (str(index), uuid):
            devices.append({"name": name, "containerEdits": {"deviceNodes": [node(minor)]}})
    devices.append({"name": "all", "containerEdits": {"deviceNodes": [node(m) for _, _, m in gpus]}})
    spec = {"cdiVersion": "0.5.0", "kind": args.kind, "devices": devices, "containerEdits": common}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(spec, f, indent=1)
    os.rename(tmp, args.out)
    for index, uuid, minor in gpus:
        print(f"GPU {index} {uuid} /dev/nvidia{minor}")
    print(f"{len(common.get('mounts', []))} mounts, {len(common['deviceNodes'])} common device nodes")


def edits(spec_path, device):
    """The spec's common edits and those of DEVICE (a name without the kind), merged."""
    spec = json.load(open(spec_path))
    dev = next((d for d in spec["devices"] if d["name"] == device), None)
    if dev is None:
        sys.exit(f"gpuspec: no device {device!r} in {spec_path}")
    common = spec.get("containerEdits", {})
    return {
        "env": common.get("env", []) + dev["containerEdits"].get("env", []),
        "deviceNodes": dev["containerEdits"].get("deviceNodes", []) + common.get("deviceNodes", []),
        "mounts": common.get("mounts", []) + dev["containerEdits"].get("mounts", []),
    }


def ctr_args(args):
    e = edits(args.spec, args.device)
    out = []
    for n in e["deviceNodes"]:
        if os.path.exists(n["path"]):
            out += ["--device", n["path"]]
        else:
            print(f"gpuspec: {n['path']} is not a device node here: left out of ctr's flags", file=sys.stderr)
    for m in e["mounts"]:
        opts = ["rbind" if o in ("bind", "rbind") else o for o in m.get("options", [])]
        out += ["--mount", f"type=bind,src={m['hostPath']},dst={m['containerPath']},options={':'.join(opts)}"]
    for kv in e["env"]:
        out += ["--env", kv]
    print("\n".join(out))


def node_numbers(n):
    if "major" in n:
        return n.get("type", "c"), n["major"], n["minor"]
    st = os.stat(n["path"])
    return "c", os.major(st.st_rdev), os.minor(st.st_rdev)


def runc_bundle(args):
    """Edits the config.json `runc spec` wrote: a runc bundle for the container tests."""
    cfg = json.load(open(args.config))
    e = edits(args.spec, args.device)
    cfg["root"] = {"path": os.path.abspath(args.rootfs), "readonly": False}
    p = cfg["process"]
    p["terminal"] = False
    p["args"] = args.args
    env = [kv for kv in p.get("env", []) if not kv.startswith("TERM=")]
    for kv in e["env"] + args.env:
        k = kv.split("=", 1)[0]
        env = [x for x in env if not x.startswith(k + "=")] + [kv]
    p["env"] = env
    linux = cfg.setdefault("linux", {})
    devs = linux.setdefault("devices", [])
    rules = linux.setdefault("resources", {}).setdefault("devices", [{"allow": False, "access": "rwm"}])
    for n in e["deviceNodes"]:
        t, major, minor = node_numbers(n)
        devs.append({"path": n["path"], "type": t, "major": major, "minor": minor, "fileMode": 0o666, "uid": 0, "gid": 0})
        rules.append({"allow": True, "type": t, "major": major, "minor": minor, "access": "rwm"})
    mounts = cfg.setdefault("mounts", [])
    for m in e["mounts"]:
        opts = ["rbind" if o in ("bind", "rbind") else o for o in m.get("options", [])]
        mounts.append({"destination": m["containerPath"], "type": "bind", "source": m["hostPath"], "options": opts})
    for b in args.bind:
        parts = b.split(":")
        opts = ["rbind", "ro" if parts[2:] == ["ro"] else "rw"]
        mounts.append({"destination": parts[1], "type": "bind", "source": parts[0], "options": opts})
    ann = cfg.setdefault("annotations", {})
    for kv in args.annotation:
        k, v = kv.split("=", 1)
        ann[k] = v
    with open(args.config, "w") as f:
        json.dump(cfg, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("cdi")
    c.add_argument("out")
    c.add_argument("--kind", required=True)
    g = c.add_mutually_exclusive_group(required=True)
    g.add_argument("--gpu", metavar="DRIVER_DIR")
    g.add_argument("--sim", nargs=3, metavar=("GPUS_JSON", "LIBDIR", "SOCKDIR"))
    c.set_defaults(fn=cdi)
    c = sub.add_parser("ctr-args")
    c.add_argument("spec")
    c.add_argument("device")
    c.set_defaults(fn=ctr_args)
    c = sub.add_parser("runc-bundle")
    c.add_argument("config")
    c.add_argument("spec")
    c.add_argument("device")
    c.add_argument("--rootfs", required=True)
    c.add_argument("--bind", action="append", default=[])
    c.add_argument("--annotation", action="append", default=[])
    c.add_argument("--env", action="append", default=[])
    c.add_argument("args", nargs="+")
    c.set_defaults(fn=runc_bundle)
    a = ap.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
