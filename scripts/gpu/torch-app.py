"""torch-app: the PyTorch test application for the GPU machine.

Holds GIB gibibytes of random int64 from a seeded CUDA generator. On each SIGUSR1 it draws the
same numbers again into a second tensor and compares the two bit for bit (torch.equal), then
appends "verified equal=True|False" to STATUS. Usage: python3 torch-app.py GIB SEED STATUS
"""
import os
import signal
import sys

import torch

gib, seed, status = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])


def draw():
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    n = int(gib * (1 << 30)) // 8
    return torch.randint(-(2**62), 2**62, (n,), dtype=torch.int64, device="cuda", generator=g)


def say(line):
    with open(status, "a") as f:
        f.write(line + "\n")


data = draw()
torch.cuda.synchronize()
say(f"ready pid={os.getpid()} bytes={data.numel() * 8}")
while True:
    signal.sigwait([signal.SIGUSR1])
    ref = draw()
    equal = torch.equal(data, ref)
    del ref
    torch.cuda.empty_cache()
    say(f"verified equal={equal}")
