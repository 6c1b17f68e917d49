#!/usr/bin/env python3
"""Redis GET throughput over values several times a memory budget: the application
benchmark of issue 46, run as the program of `uswap run --against kernel|zswap|zram`
(so that both sides run the same server, client and data in one memory cgroup each).

Starts Debian's redis-server (no persistence) on a loopback port, loads VALUES keys
`key:%012d` (the names redis-benchmark's `-r` draws) with VALUE_BYTES bytes of
incompressible data each, from a seeded stream, through `redis-cli --pipe`; then runs
`redis-benchmark -t get` with random keys over all of them; then reads SAMPLE keys back
and checks every byte. Prints one line: `redis-get: rps R p50_ms A p99_ms B load_s L
checked N`. Exit 1 on a wrong byte, a server that died, or a client that failed.

Environment (defaults): VALUES (1000000), VALUE_BYTES (1000), REQUESTS (300000),
CLIENTS (8), SAMPLE (2000), REDIS_PORT (7399).
"""
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time

VALUES = int(os.environ.get("VALUES", 1_000_000))
SIZE = int(os.environ.get("VALUE_BYTES", 1000))
REQUESTS = int(os.environ.get("REQUESTS", 300_000))
CLIENTS = int(os.environ.get("CLIENTS", 8))
SAMPLE = int(os.environ.get("SAMPLE", 2000))
PORT = int(os.environ.get("REDIS_PORT", 7399))
SEED = 46
CHUNK = 4096  # values generated per randbytes call


def values():
    """The values in key order: a seeded stream, cut in VALUE_BYTES pieces."""
    rng = random.Random(SEED)
    for start in range(0, VALUES, CHUNK):
        n = min(CHUNK, VALUES - start)
        block = rng.randbytes(n * SIZE)
        for j in range(n):
            yield start + j, block[j * SIZE:(j + 1) * SIZE]


def key(i):
    return b"key:%012d" % i


def resp_set(i, v):
    k = key(i)
    return b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(k), k, len(v), v)


def wait_ready(proc):
    end = time.time() + 30
    while time.time() < end:
        if proc.poll() is not None:
            sys.exit(f"redis-get: redis-server exited at start ({proc.returncode})")
        try:
            with socket.create_connection(("127.0.0.1", PORT), timeout=1) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return
        except OSError:
            pass
        time.sleep(0.1)
    sys.exit("redis-get: redis-server did not answer in 30 s")


def get_exact(s, i):
    """GET key i on socket s (a file), the value's bytes."""
    k = key(i)
    s.write(b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(k), k))
    s.flush()
    head = s.readline()
    if not head.startswith(b"$"):
        return None
    n = int(head[1:])
    data = s.read(n + 2)
    return data[:n]


def main():
    for tool in ("redis-server", "redis-cli", "redis-benchmark"):
        if not shutil.which(tool):
            sys.exit(f"redis-get: {tool} not found (apt-get install redis-server redis-tools)")
    work = tempfile.mkdtemp(prefix="redis-get-")
    server = subprocess.Popen(
        ["redis-server", "--port", str(PORT), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", work, "--protected-mode", "yes"],
        stdout=subprocess.DEVNULL)
    try:
        wait_ready(server)
        t0 = time.time()
        pipe = subprocess.Popen(["redis-cli", "-p", str(PORT), "--pipe"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        batch = []
        for i, v in values():
            batch.append(resp_set(i, v))
            if len(batch) == 1024:
                pipe.stdin.write(b"".join(batch))
                batch.clear()
        pipe.stdin.write(b"".join(batch))
        pipe.stdin.close()
        out = pipe.stdout.read().decode()
        if pipe.wait() != 0 or "errors: 0" not in out:
            sys.exit(f"redis-get: loading failed: {out.strip()}")
        load_s = time.time() - t0
        bench = subprocess.run(
            ["redis-benchmark", "-p", str(PORT), "-t", "get", "-n", str(REQUESTS),
             "-r", str(VALUES), "-c", str(CLIENTS), "--csv"],
            capture_output=True, text=True)
        if bench.returncode != 0:
            sys.exit(f"redis-get: redis-benchmark failed: {bench.stderr.strip()}")
        rows = [l.replace('"', "").split(",") for l in bench.stdout.splitlines()]
        head = rows[0]
        get = next(r for r in rows[1:] if r[0].startswith("GET"))
        col = {name: float(get[j]) for j, name in enumerate(head) if j > 0}
        # Check a sample of the values, byte for byte (one pass over the stream).
        rng = random.Random(SEED + 1)
        want = set(rng.randrange(VALUES) for _ in range(SAMPLE))
        with socket.create_connection(("127.0.0.1", PORT), timeout=60) as sock:
            f = sock.makefile("rwb")
            for i, v in values():
                if i in want and get_exact(f, i) != v:
                    sys.exit(f"redis-get: key {i}: wrong bytes")
        if server.poll() is not None:
            sys.exit(f"redis-get: redis-server died ({server.returncode})")
        print(f"redis-get: rps {col['rps']:.0f} p50_ms {col['p50_latency_ms']:.3f} "
              f"p99_ms {col['p99_latency_ms']:.3f} load_s {load_s:.1f} checked {len(want)}",
              flush=True)
    finally:
        subprocess.run(["redis-cli", "-p", str(PORT), "shutdown", "nosave"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
