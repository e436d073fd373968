#!/usr/bin/env python3
"""Checkpoint, drain and restore GPU workloads of a Kubernetes node.

    gpuctl.py checkpoint --kubelet URL [--store DIR] [--dry-run] ...
    gpuctl.py drain NODE --kubelet URL --store DIR [--dry-run] ...
    gpuctl.py restore --store DIR --registry REGISTRY [--node NODE] [--dry-run] ...

checkpoint: lists the node's pods from the kubelet (GET /pods), and for every running container
that requests a GPU resource (nvidia.com/gpu, amd.com/gpu, ...) calls the kubelet checkpoint API
(POST /checkpoint/{namespace}/{pod}/{container}); the kubelet has the container runtime
checkpoint it through CRIU, with the GPU plugin. The archives are copied into --store with a
manifest (manifest.json) that also keeps each pod's spec for the restore.

drain: checkpoint, then cordon and drain the node with kubectl. Nothing is drained unless every
GPU container was saved.

restore: for every saved container, builds an OCI image from its archive the way CRI-O
documents it (buildah, with the io.kubernetes.cri-o.annotations.checkpoint.name annotation),
pushes it, and creates the pod again from its saved spec with that image (kubectl apply),
optionally pinned to --node. With --check, runs criu-gpu-check on each archive first (on the
target node), and stops if this node cannot restore it.

Every run prints its progress, ends with a summary, and exits non-zero with the reason if
anything failed. --dry-run shows what would be done and does nothing.
"""

import argparse
import json
import os
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915")
CHECKPOINT_ANNOTATION = "io.kubernetes.cri-o.annotations.checkpoint.name"


class Failure(Exception):
    """A step that failed, with the reason an operator needs."""


def say(msg):
    print(msg, flush=True)


# ---- kubelet ----

class Kubelet:
    def __init__(self, url, token=None, cacert=None, insecure=False, timeout=600):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.ctx = None
        if self.url.startswith("https:"):
            self.ctx = ssl.create_default_context(cafile=cacert)
            if insecure:
                self.ctx.check_hostname = False
                self.ctx.verify_mode = ssl.CERT_NONE

    def request(self, method, path):
        req = urllib.request.Request(self.url + path, method=method)
        if self.token:
            req.add_header("Authorization", "Bearer " + self.token)
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=self.timeout + 30) as r:
                return json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            body = e.read().decode(errors="replace").strip()
            hint = ""
            if e.code in (401, 403):
                hint = " (the token needs the nodes/checkpoint and nodes/proxy permissions)"
            elif e.code == 404 and path.startswith("/checkpoint"):
                hint = " (is the ContainerCheckpoint feature gate on?)"
            raise Failure(f"kubelet {method} {path}: HTTP {e.code}: {body}{hint}") from None
        except (urllib.error.URLError, OSError) as e:
            raise Failure(f"kubelet {self.url} unreachable: {e}") from None

    def pods(self):
        return self.request("GET", "/pods").get("items", [])

    def checkpoint(self, ns, pod, container):
        q = urllib.parse.quote
        path = f"/checkpoint/{q(ns)}/{q(pod)}/{q(container)}?timeout={self.timeout}"
        items = self.request("POST", path).get("items") or []
        if not items:
            raise Failure(f"kubelet returned no checkpoint archive for {ns}/{pod}/{container}")
        return items[0]


def gpu_containers(pods, namespace=None, resources=GPU_RESOURCES):
    """(pod, container) pairs of running containers that ask for a GPU."""
    out = []
    for pod in pods:
        meta = pod.get("metadata", {})
        if namespace and meta.get("namespace") != namespace:
            continue
        if pod.get("status", {}).get("phase") != "Running":
            continue
        running = {
            s.get("name")
            for s in pod.get("status", {}).get("containerStatuses", [])
            if "running" in (s.get("state") or {})
        }
        for c in pod.get("spec", {}).get("containers", []):
            res = c.get("resources", {})
            wanted = {**res.get("requests", {}), **res.get("limits", {})}
            if any(r in wanted and str(wanted[r]) not in ("0", "") for r in resources) and c["name"] in running:
                out.append((pod, c))
    return out


# ---- checkpoint ----

def checkpoint(args):
    kubelet = Kubelet(args.kubelet, read_token(args), args.cacert, args.insecure, args.timeout)
    pods = kubelet.pods()
    targets = gpu_containers(pods, args.namespace, tuple(args.resources.split(",")))
    say(f"{len(targets)} GPU container(s) in {len(pods)} pod(s) on {args.kubelet}")
    manifest = {"created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "kubelet": args.kubelet, "containers": []}
    failures = []
    for i, (pod, c) in enumerate(targets, 1):
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        label = f"[{i}/{len(targets)}] {ns}/{name}/{c['name']}"
        if args.dry_run:
            say(f"{label}: would POST /checkpoint/{ns}/{name}/{c['name']}")
            continue
        say(f"{label}: checkpointing ...")
        start = time.time()
        entry = {"namespace": ns, "pod": name, "container": c["name"], "pod_spec": clean_pod(pod)}
        try:
            archive = kubelet.checkpoint(ns, name, c["name"])
            entry["node_archive"] = archive
            if args.store:
                os.makedirs(args.store, exist_ok=True)
                dest = os.path.join(args.store, os.path.basename(archive))
                shutil.copyfile(archive, dest)
                entry["archive"] = dest
            else:
                entry["archive"] = archive
            entry["bytes"] = os.path.getsize(entry["archive"])
            entry["seconds"] = round(time.time() - start, 2)
            say(f"{label}: saved {entry['archive']} ({human(entry['bytes'])}, {entry['seconds']} s)")
        except (Failure, OSError) as e:
            entry["error"] = str(e)
            failures.append(f"{ns}/{name}/{c['name']}: {e}")
            say(f"{label}: FAILED: {e}")
        manifest["containers"].append(entry)
    if args.store and not args.dry_run:
        os.makedirs(args.store, exist_ok=True)
        with open(os.path.join(args.store, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=2)
    summary("checkpoint", manifest["containers"], failures, args)
    return failures


def clean_pod(pod):
    """The pod as a new object: its spec and labels, without what the cluster filled in."""
    meta = pod.get("metadata", {})
    spec = dict(pod.get("spec", {}))
    for k in ("nodeName",):
        spec.pop(k, None)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "labels": meta.get("labels", {}),
            "annotations": {k: v for k, v in meta.get("annotations", {}).items() if not k.startswith("kubernetes.io/")},
        },
        "spec": spec,
    }


def human(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024


def summary(what, entries, failures, args):
    say("----")
    if args.dry_run:
        say(f"dry run: nothing was done ({what})")
        return
    ok = [e for e in entries if "error" not in e]
    say(f"{what}: {len(ok)} of {len(entries)} done")
    for e in ok:
        where = e.get("archive") or e.get("image")
        say(f"  {e['namespace']}/{e['pod']}/{e['container']} -> {where}")
    for f in failures:
        say(f"  FAILED {f}")
    if getattr(args, "store", None):
        say(f"manifest: {os.path.join(args.store, 'manifest.json')}")


def read_token(args):
    if args.token_file:
        with open(args.token_file) as f:
            return f.read().strip()
    return os.environ.get("KUBELET_TOKEN")


# ---- drain ----

def run(cmd, dry_run):
    say(("would run: " if dry_run else "$ ") + " ".join(cmd))
    if dry_run:
        return ""
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise Failure(f"{' '.join(cmd[:2])} failed ({p.returncode}): {(p.stderr or p.stdout).strip()}")
    return p.stdout


def drain(args):
    failures = checkpoint(args)
    if failures:
        raise Failure(f"{len(failures)} GPU container(s) could not be saved; node {args.node} is NOT drained")
    run(["kubectl", "cordon", args.node], args.dry_run)
    run(["kubectl", "drain", args.node, "--ignore-daemonsets", "--delete-emptydir-data", f"--timeout={args.drain_timeout}s"], args.dry_run)
    say(f"node {args.node} drained" if not args.dry_run else f"dry run: node {args.node} would be drained")
    return []


# ---- restore ----

def restore(args):
    with open(os.path.join(args.store, "manifest.json")) as f:
        manifest = json.load(f)
    entries = [e for e in manifest["containers"] if "error" not in e]
    say(f"{len(entries)} saved GPU container(s) in {args.store}")
    failures, results = [], []
    for i, e in enumerate(entries, 1):
        label = f"[{i}/{len(entries)}] {e['namespace']}/{e['pod']}/{e['container']}"
        archive = e["archive"]
        if not os.path.isabs(archive):
            archive = os.path.join(args.store, archive)
        try:
            if not os.path.exists(archive):
                raise Failure(f"archive {archive} is missing from the store")
            if args.check:
                say(f"{label}: checking that this node can restore it ...")
                p = subprocess.run(["criu-gpu-check", archive], capture_output=True, text=True)
                if p.returncode != 0:
                    raise Failure("criu-gpu-check: " + (p.stdout + p.stderr).strip().splitlines()[-1])
            image = f"{args.registry.rstrip('/')}/checkpoint-{e['pod']}-{e['container']}:{args.tag}"
            say(f"{label}: building {image} from the checkpoint archive")
            ctr = run(["buildah", "from", "scratch"], args.dry_run).strip() or "working-container"
            run(["buildah", "add", ctr, archive, "/"], args.dry_run)
            run(["buildah", "config", f"--annotation={CHECKPOINT_ANNOTATION}={e['container']}", ctr], args.dry_run)
            run(["buildah", "commit", ctr, image], args.dry_run)
            run(["buildah", "rm", ctr], args.dry_run)
            run(["buildah", "push", image], args.dry_run)
            pod = e["pod_spec"]
            for c in pod["spec"]["containers"]:
                if c["name"] == e["container"]:
                    c["image"] = image
            if args.node:
                pod["spec"]["nodeName"] = args.node
            manifest_path = os.path.join(args.store, f"pod-{e['namespace']}-{e['pod']}.json")
            with open(manifest_path, "w") as f:
                json.dump(pod, f, indent=2)
            run(["kubectl", "apply", "-f", manifest_path], args.dry_run)
            results.append({**e, "image": image})
            say(f"{label}: restored from {image}" if not args.dry_run else f"{label}: would restore from {image}")
        except (Failure, OSError) as err:
            results.append({**e, "error": str(err)})
            failures.append(f"{e['namespace']}/{e['pod']}/{e['container']}: {err}")
            say(f"{label}: FAILED: {err}")
    summary("restore", results, failures, args)
    return failures


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    def kubelet_opts(s):
        s.add_argument("--kubelet", default="https://127.0.0.1:10250", help="the kubelet API (default: this node's)")
        s.add_argument("--token-file", help="bearer token file (default: $KUBELET_TOKEN)")
        s.add_argument("--cacert", help="CA bundle of the kubelet's certificate")
        s.add_argument("--insecure", action="store_true", help="do not verify the kubelet's certificate")
        s.add_argument("--namespace", help="only this namespace")
        s.add_argument("--resources", default=",".join(GPU_RESOURCES), help="GPU resource names")
        s.add_argument("--timeout", type=int, default=600, help="checkpoint timeout per container (s)")
        s.add_argument("--store", help="copy the archives here and write manifest.json")
        s.add_argument("--dry-run", action="store_true")

    c = sub.add_parser("checkpoint", help="checkpoint the node's GPU containers")
    kubelet_opts(c)
    d = sub.add_parser("drain", help="checkpoint the GPU containers, then drain the node")
    d.add_argument("node")
    kubelet_opts(d)
    d.add_argument("--drain-timeout", type=int, default=600)
    r = sub.add_parser("restore", help="restore saved GPU containers (CRI-O checkpoint images)")
    r.add_argument("--store", required=True)
    r.add_argument("--registry", required=True, help="where to push the checkpoint images")
    r.add_argument("--tag", default="latest")
    r.add_argument("--node", help="pin the restored pods to this node")
    r.add_argument("--check", action="store_true", help="run criu-gpu-check on each archive first")
    r.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    if args.cmd == "drain" and not args.store and not args.dry_run:
        p.error("drain needs --store: the archives must outlive the node")
    try:
        failures = {"checkpoint": checkpoint, "drain": drain, "restore": restore}[args.cmd](args)
    except Failure as e:
        say(f"ERROR: {e}")
        return 1
    if failures:
        say(f"ERROR: {len(failures)} failure(s); see above")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
