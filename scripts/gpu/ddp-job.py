"""ddp-job: a deterministic PyTorch DDP training job for the GPU machine's distributed tests.

Each rank trains the same model under DistributedDataParallel (NCCL) on synthetic batches drawn
from (seed, step, rank), holds BALLAST GiB of seeded random data on its GPU, and checks an
explicit all_reduce every step. Per rank it writes OUT/rank<R>.log (held open, as training logs
are): "ready", every --log-every steps "step N loss <float.hex()> allreduce ok|BAD" (the loss of
that step; the all_reduce checks of the steps since), and at the end "params <sha256>" and
"ballast ok|BAD", then "store ok" once a new barrier() and a set/get between the ranks through
the job's TCPStore (libuv's unless USE_LIBUV=0; torchrun's agent's under torchrun) worked after
the training, hence after any restore; with --times, OUT/rank<R>.times holds "N <CLOCK_MONOTONIC seconds>" per step
(the host's view: a gap is the time the job was stopped). Two runs with the same arguments write
the same log lines; a run that was dumped and restored must too.

--ok-log LOG: each rank also appends, per step, "step=N pid=P loss=<hex> ok" to LOG.rank<R>
(or "MISMATCH step=N pid=P allreduce BAD", then exits 3), opening the file for each line: the
protocol of the simulated GPU's job (cuda-sim-app --ranks), which the Rust scenarios read
(tests/tests/scenarios/job.rs).

--sleep 0 trains flat out: the host only waits for the GPU at log lines, as real jobs do.
--model mlp is a small MLP (the earlier runs); wide is an 8-layer 2048-wide MLP on batches of
512, a few ms of GPU work per step. --device cpu (gloo) runs it without a GPU, for trying the
script out.

  python3 ddp-job.py --spawn 2 OUT [--steps N] [--sleep S] [--ballast GIB] [--port P] [...]
  torchrun --standalone --nproc-per-node 2 ddp-job.py OUT [...]   (rank from the environment)
  torchrun --nnodes 2 --node-rank R --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint H:P \
      ddp-job.py OUT [...]                           (one launch per node: scripts/gpu/multinode.sh)
"""
import argparse
import hashlib
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


def args():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--spawn", type=int, default=0, help="start N ranks with torch.multiprocessing")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--sleep", type=float, default=0.02)
    p.add_argument("--ballast", type=float, default=1.0)
    p.add_argument("--port", type=int, default=29511)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--model", choices=["mlp", "wide"], default="mlp")
    p.add_argument("--log-every", type=int, default=1)
    p.add_argument("--times", action="store_true")
    p.add_argument("--gpus", type=int, default=0, help="ranks share this many GPUs (rank %% gpus)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--ok-log", help="also log each step in the simulated job's protocol")
    return p.parse_args()


def deterministic():
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False


def ballast(gib, seed, device):
    n = int(gib * (1 << 30)) // 8
    if n == 0:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return torch.randint(-(2**62), 2**62, (n,), dtype=torch.int64, device=device, generator=g)


def model_of(kind):
    if kind == "wide":
        layers = []
        for _ in range(8):
            layers += [torch.nn.Linear(2048, 2048), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers, torch.nn.Linear(2048, 1)), 512, 2048
    m = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 1),
    )
    return m, 64, 256


def train(rank, world, a):
    deterministic()
    if a.device == "cuda":
        # Across nodes (torchrun --nnodes) the GPU is the node's own: the local rank's.
        local = int(os.environ.get("LOCAL_RANK", rank))
        ordinal = rank % a.gpus if a.gpus else local
        torch.cuda.set_device(ordinal)
        dev = torch.device("cuda", ordinal)
        backend, kw = "nccl", {"device_id": dev}
    else:
        dev = torch.device("cpu")
        backend, kw = "gloo", {}
    if "MASTER_ADDR" in os.environ and "TORCHELASTIC_RUN_ID" in os.environ:
        dist.init_process_group(backend, **kw)
    else:
        dist.init_process_group(
            backend, init_method=f"tcp://127.0.0.1:{a.port}", rank=rank, world_size=world, **kw
        )
    log = open(os.path.join(a.out, f"rank{rank}.log"), "w", buffering=1)
    times = open(os.path.join(a.out, f"rank{rank}.times"), "w") if a.times else None
    torch.manual_seed(a.seed)
    model, batch, width = model_of(a.model)
    model = model.to(dev)
    ddp = DDP(model, device_ids=[dev.index] if a.device == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    weight = ballast(a.ballast, a.seed + 1000 * rank, dev)
    if a.device == "cuda":
        torch.cuda.synchronize()
    log.write(f"ready pid={os.getpid()} world={world}\n")
    want = torch.tensor([world * (world + 1) / 2, 0.0], device=dev)
    ok = torch.ones((), dtype=torch.bool, device=dev)
    for step in range(a.steps):
        g = torch.Generator(device=dev)
        g.manual_seed(a.seed * 1_000_003 + step * 101 + rank)
        x = torch.randn(batch, width, device=dev, generator=g)
        y = x.sum(dim=1, keepdim=True).tanh()
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        check = torch.tensor([float(rank + 1), float(step)], device=dev)
        dist.all_reduce(check)
        want[1] = float(step * world)
        ok &= (check == want).all()
        if times is not None:
            times.write(f"{step} {time.monotonic():.6f}\n")
        if a.ok_log:
            ok_line(a.ok_log, rank, step, loss, ok)
        if (step + 1) % a.log_every == 0 or step + 1 == a.steps:
            log.write(f"step {step} loss {loss.item().hex()} allreduce {'ok' if bool(ok) else 'BAD'}\n")
            ok = torch.ones((), dtype=torch.bool, device=dev)
            if times is not None:
                times.flush()
        if a.sleep > 0:
            time.sleep(a.sleep)
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    log.write(f"params {h.hexdigest()}\n")
    if weight is not None:
        same = torch.equal(weight, ballast(a.ballast, a.seed + 1000 * rank, dev))
        log.write(f"ballast {'ok' if same else 'BAD'}\n")
    log.write(f"store {store_check(rank, world)}\n")
    if times is not None:
        times.close()
    log.write("done\n")
    dist.destroy_process_group()


def ok_line(path, rank, step, loss, ok):
    """One line per step in cuda-sim-app's job protocol; a wrong all_reduce ends the rank."""
    with open(f"{path}.rank{rank}", "a") as f:
        if bool(ok):
            f.write(f"step={step + 1} pid={os.getpid()} loss={loss.item().hex()} ok\n")
        else:
            f.write(f"MISMATCH step={step + 1} pid={os.getpid()} allreduce BAD\n")
            f.close()
            os._exit(3)


def store_check(rank, world):
    """A new barrier, then each rank sets a key and reads its peer's through the default store."""
    dist.barrier()
    store = dist.distributed_c10d._get_default_store()
    store.set(f"ddp-job/{rank}", str(rank * 7 + 1))
    peer = (rank + 1) % world
    got = store.get(f"ddp-job/{peer}").decode()
    return "ok" if got == str(peer * 7 + 1) else f"BAD {got}"


def main():
    a = args()
    os.makedirs(a.out, exist_ok=True)
    if a.spawn:
        mp.spawn(train, args=(a.spawn, a), nprocs=a.spawn, join=True)
    else:
        # The global rank: across nodes each node's first worker has LOCAL_RANK 0.
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), a)


if __name__ == "__main__":
    main()
