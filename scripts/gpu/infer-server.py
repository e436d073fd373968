"""infer-server: a PyTorch inference server for scripts/gpu/store-bench.sh.

Holds GIB gibibytes of bf16 weights on the GPU: a stack of square linear layers drawn from a
seeded CUDA generator with the spread of a trained transformer's weights (std 0.02), so that two
servers started with the same SEED hold the same bytes, as two replicas loading one model do.
Listens on 127.0.0.1:PORT; each connection sends one line, a request number N, and gets one line
back: the sha256 of the output of the layers for an input drawn from N, then the connection
closes (no connection stays open across a checkpoint). Appends "ready pid=P port=PORT gib=G" to
STATUS once it serves. Usage: python3 infer-server.py PORT GIB SEED STATUS [WIDTH]
"""
import hashlib
import os
import socket
import sys

import torch

port, gib, seed, status = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
width = int(sys.argv[5]) if len(sys.argv) > 5 else 8192
layer_bytes = width * width * 2
layers = max(1, int(gib * (1 << 30)) // layer_bytes)
g = torch.Generator(device="cuda")
g.manual_seed(seed)
weights = [
    (torch.randn(width, width, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    for _ in range(layers)
]
torch.cuda.synchronize()
torch.cuda.empty_cache()


@torch.inference_mode()
def answer(n):
    x = torch.Generator(device="cuda")
    x.manual_seed(n)
    h = torch.randn(8, width, device="cuda", generator=x).to(torch.bfloat16)
    for w in weights:
        h = torch.nn.functional.gelu(h @ w)
        h = h / (h.float().norm(dim=-1, keepdim=True).to(torch.bfloat16) + 1)
    return hashlib.sha256(h.float().cpu().numpy().tobytes()).hexdigest()


srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", port))
srv.listen(16)
answer(0)
with open(status, "a") as f:
    f.write(f"ready pid={os.getpid()} port={port} gib={layers * layer_bytes / 2**30:.2f}\n")
while True:
    conn, _ = srv.accept()
    with conn:
        line = conn.makefile().readline().strip()
        try:
            conn.sendall((answer(int(line)) + "\n").encode())
        except ValueError:
            conn.sendall(b"error: send a request number\n")
