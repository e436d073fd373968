"""train.py: the PyTorch container of scripts/gpu/containers/run.sh.

A small deterministic training loop on the GPU: a seeded MLP learns a fixed random regression
task with AdamW; every step appends "step N loss X" (the loss to 10 digits) to LOG, and the end
"params <sum> <sum of squares>" and "done". The data, the weights and the optimizer state live
on the GPU only; a run checkpointed and restored part-way must log exactly the lines of an
uninterrupted run. Each line is written with the file opened for it (no file is open across a
checkpoint).

Usage: python3 train.py LOG [--steps N] [--sleep S]
"""

import argparse
import os
import time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("log")
ap.add_argument("--steps", type=int, default=300)
ap.add_argument("--sleep", type=float, default=0.02)
args = ap.parse_args()


def say(line):
    with open(args.log, "a") as f:
        f.write(line + "\n")


torch.manual_seed(1234)
torch.use_deterministic_algorithms(True)
torch.backends.cudnn.benchmark = False
torch.backends.cuda.matmul.allow_tf32 = False
dev = torch.device("cuda")
g = torch.Generator(device=dev)
g.manual_seed(42)
x = torch.randn(4096, 512, device=dev, generator=g)
w_true = torch.randn(512, 64, device=dev, generator=g)
y = torch.tanh(x @ w_true)
model = torch.nn.Sequential(
    torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 64)
).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
say(f"start pid={os.getpid()} device={torch.cuda.get_device_name(0)}")
for step in range(args.steps):
    idx = torch.arange(step * 256, step * 256 + 256, device=dev) % x.shape[0]
    loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    say(f"step {step} loss {loss.item():.10f}")
    time.sleep(args.sleep)
with torch.no_grad():
    flat = torch.cat([p.flatten() for p in model.parameters()])
    say(f"params {flat.sum().item():.10f} {(flat * flat).sum().item():.10f}")
say("done")
