"""A tree of N processes holding MIB MiB of random data each (scripts/gpu/tree-dump.sh).

Each child writes the sha256 of its data to OUT.I once it holds it, and when OUT.check appears
hashes its data again and writes "ok" or "BAD" to OUT.I.res, then exits.
"""
import hashlib
import os
import sys
import time

n, mib, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
for i in range(n):
    if os.fork() == 0:
        data = bytearray(os.urandom(mib << 20))
        digest = hashlib.sha256(data).hexdigest()
        with open(f"{out}.{i}", "w") as f:
            f.write(digest + "\n")
        while not os.path.exists(f"{out}.check"):
            time.sleep(0.2)
        ok = hashlib.sha256(data).hexdigest() == digest
        with open(f"{out}.{i}.res", "w") as f:
            f.write("ok\n" if ok else "BAD\n")
        os._exit(0)
while True:
    time.sleep(1)
