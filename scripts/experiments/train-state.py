"""train-state: a PyTorch process holding a training job's state on the GPU, for measuring what
compression does to real GPU data in a CRIU image (scripts/experiments/compress-pages.sh).

A transformer encoder (LAYERS layers of width WIDTH, fp32 weights) trained for STEPS steps with
AdamW under bf16 autocast on random data: weights, gradients, both Adam moments and the caching
allocator's blocks, as a checkpoint of a training job holds them. Then it appends
"ready pid=P gib=G" to STATUS and sleeps.
Usage: python3 train-state.py STATUS [LAYERS [WIDTH [STEPS]]]
"""
import os
import sys
import time

import torch

status = sys.argv[1]
layers = int(sys.argv[2]) if len(sys.argv) > 2 else 8
width = int(sys.argv[3]) if len(sys.argv) > 3 else 2048
steps = int(sys.argv[4]) if len(sys.argv) > 4 else 30

torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(width, 16, 4 * width, batch_first=True)
model = torch.nn.TransformerEncoder(layer, layers).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn(8, 512, width, device="cuda")
for _ in range(steps):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=False)
torch.cuda.synchronize()
gib = torch.cuda.memory_reserved() / 2**30
with open(status, "a") as f:
    f.write(f"ready pid={os.getpid()} gib={gib:.2f} loss={loss.item():.6f}\n")
while True:
    time.sleep(3600)
