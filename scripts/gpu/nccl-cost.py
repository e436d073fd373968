"""nccl-cost: what checkpointability costs a job. Two ranks (one per GPU, torch.multiprocessing)
with NCCL as the environment sets it up: all_reduce bus bandwidth at several sizes, as
nccl-tests measures it (busbw = 2 (n-1)/n x bytes / time, the mean of --iters after warm-up),
then the step time of the DDP job of ddp-job.py (--model wide) training flat out. Prints one
JSON line: {"setting": NAME, "transports": ..., "busbw_gbs": {size: GB/s}, "step_ms": ms}.

  NAME=sockets NCCL_P2P_DISABLE=1 ... python3 nccl-cost.py [--port P]
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = [1 << 20, 16 << 20, 128 << 20, 1 << 30]


def bench(rank, world, a, q):
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{a.port}", rank=rank, world_size=world, device_id=dev
    )
    out = {}
    for size in SIZES:
        x = torch.ones(size // 4, dtype=torch.float32, device=dev)
        for _ in range(3):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        iters = a.iters if size < (256 << 20) else max(5, a.iters // 4)
        t = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        took = (time.perf_counter() - t) / iters
        out[f"{size >> 20}MiB"] = round(2 * (world - 1) / world * size / took / 1e9, 2)
    layers = []
    for _ in range(8):
        layers += [torch.nn.Linear(2048, 2048), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(2048, 1)).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(512, 2048, device=dev)
    y = x.sum(dim=1, keepdim=True).tanh()

    def step():
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()

    for _ in range(10):
        step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(a.steps):
        step()
    torch.cuda.synchronize()
    step_ms = (time.perf_counter() - t) / a.steps * 1e3
    if rank == 0:
        q.put({"busbw_gbs": out, "step_ms": round(step_ms, 3)})
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=29700)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--steps", type=int, default=100)
    a = p.parse_args()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    mp.spawn(bench, args=(2, a, q), nprocs=2, join=True)
    r = q.get(timeout=5)
    r["setting"] = os.environ.get("NAME", "?")
    r["env"] = {k: v for k, v in os.environ.items() if k.startswith("NCCL_") and k != "NCCL_DEBUG"}
    print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
