"""ddp-job: a deterministic PyTorch DDP training job for the GPU machine's distributed tests.

Each rank trains the same small MLP under DistributedDataParallel (NCCL) on synthetic batches
drawn from (seed, step, rank), holds BALLAST GiB of seeded random data on its GPU, and checks
an explicit all_reduce every step. Per rank it writes OUT/rank<R>.log: "ready", one line per
step "step N loss <float.hex()> allreduce ok|BAD", and at the end "params <sha256>" and
"ballast ok|BAD". Two runs with the same arguments write the same lines; a run that was dumped
and restored must too.

  python3 ddp-job.py --spawn 2 OUT [--steps N] [--sleep S] [--ballast GIB] [--port P]
  torchrun --standalone --nproc-per-node 2 ddp-job.py OUT [...]   (rank from the environment)
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


def train(rank, world, a):
    deterministic()
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    if "MASTER_ADDR" in os.environ and "TORCHELASTIC_RUN_ID" in os.environ:
        dist.init_process_group("nccl", device_id=dev)
    else:
        dist.init_process_group(
            "nccl", init_method=f"tcp://127.0.0.1:{a.port}", rank=rank, world_size=world, device_id=dev
        )
    log = open(os.path.join(a.out, f"rank{rank}.log"), "w", buffering=1)
    torch.manual_seed(a.seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 1),
    ).to(dev)
    ddp = DDP(model, device_ids=[rank])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    weight = ballast(a.ballast, a.seed + 1000 * rank, dev)
    torch.cuda.synchronize()
    log.write(f"ready pid={os.getpid()} world={world}\n")
    for step in range(a.steps):
        g = torch.Generator(device=dev)
        g.manual_seed(a.seed * 1_000_003 + step * 101 + rank)
        x = torch.randn(64, 256, device=dev, generator=g)
        y = x.sum(dim=1, keepdim=True).tanh()
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        check = torch.tensor([float(rank + 1), float(step)], device=dev)
        dist.all_reduce(check)
        want = [world * (world + 1) / 2, float(step * world)]
        ok = check.tolist() == want
        log.write(f"step {step} loss {loss.item().hex()} allreduce {'ok' if ok else 'BAD'}\n")
        time.sleep(a.sleep)
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    log.write(f"params {h.hexdigest()}\n")
    if weight is not None:
        same = torch.equal(weight, ballast(a.ballast, a.seed + 1000 * rank, dev))
        log.write(f"ballast {'ok' if same else 'BAD'}\n")
    log.write("done\n")
    dist.destroy_process_group()


def main():
    a = args()
    os.makedirs(a.out, exist_ok=True)
    if a.spawn:
        mp.spawn(train, args=(a.spawn, a), nprocs=a.spawn, join=True)
    else:
        train(int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"]), a)


if __name__ == "__main__":
    main()
