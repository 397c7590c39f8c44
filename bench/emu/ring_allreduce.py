#!/usr/bin/python3
"""A plain ring allreduce over TCP, one process per emulated host: the reference for what the emulated
links allow, independent of Tandem (bench/emu/allreduce_bench.py runs it beside `tandem bench allreduce`).

  ring_allreduce.py [--rank R] --addrs A0,A1,... [--port P] [--sizes 1M,4M] [--iters 3] [--warmup 1]

The rank defaults to $TANDEM_RANK (set by `tandem launch`), else $TANDEM_EMU_HOST (set by emu-cluster exec).

Reduce-scatter then allgather over n chunks; every step sends one chunk to the next rank while receiving
one from the previous, so each link carries 2(n-1)/n * S per allreduce. Prints one JSON line per size with
this rank's per-iteration times (the driver takes the slowest rank per iteration). Exit 1 on a wrong
result; every connect and receive has a deadline.
"""
import argparse
import json
import os
import queue
import socket
import sys
import threading
import time

import numpy as np

DEADLINE_S = 120.0


def parse_size(s):
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(float(s[:-1] if s[-1:] in "KMG" else s) * mult)


def recv_exact(sock, view):
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("peer closed the ring connection")
        got += n


class Ring:
    def __init__(self, rank, addrs, port):
        self.rank, self.n = rank, len(addrs)
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((addrs[rank], port))
        ls.listen(1)
        ls.settimeout(DEADLINE_S)
        nxt = addrs[(rank + 1) % self.n]
        end = time.monotonic() + DEADLINE_S
        self.out = None
        while self.out is None:
            try:
                self.out = socket.create_connection((nxt, port), timeout=2)
            except OSError:
                if time.monotonic() > end:
                    raise TimeoutError(f"rank {rank}: cannot connect to rank {(rank + 1) % self.n} at {nxt}:{port}")
                time.sleep(0.05)
        self.inp, _ = ls.accept()
        ls.close()
        for s in (self.out, self.inp):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.settimeout(DEADLINE_S)
        self.sendq = queue.Queue()
        self.sent = queue.Queue()
        threading.Thread(target=self._sender, daemon=True).start()

    def _sender(self):
        while True:
            buf = self.sendq.get()
            try:
                self.out.sendall(buf)
                self.sent.put(None)
            except OSError as e:
                self.sent.put(e)
                return

    def exchange(self, send_buf, recv_view):
        """Sends to the next rank while receiving from the previous one."""
        self.sendq.put(send_buf)
        recv_exact(self.inp, recv_view)
        err = self.sent.get(timeout=DEADLINE_S)
        if err is not None:
            raise err

    def barrier(self):
        token = bytearray(1)
        for _ in range(2):
            self.exchange(b"\x01", memoryview(token))

    def allreduce(self, buf, tmp):
        n, r = self.n, self.rank
        chunks = np.array_split(buf, n)
        tmps = np.array_split(tmp, n)
        for step in range(n - 1):  # reduce-scatter: after it, rank r owns the sum of chunk (r + 1) % n
            s, d = (r - step) % n, (r - step - 1) % n
            self.exchange(memoryview(chunks[s]).cast("B"), memoryview(tmps[d]).cast("B"))
            chunks[d] += tmps[d]
        for step in range(n - 1):  # allgather
            s, d = (r - step + 1) % n, (r - step) % n
            self.exchange(memoryview(chunks[s]).cast("B"), memoryview(chunks[d]).cast("B"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, default=None)
    ap.add_argument("--addrs", required=True)
    ap.add_argument("--port", type=int, default=29700)
    ap.add_argument("--sizes", default="1M,4M")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    a = ap.parse_args()
    if a.rank is None:
        env = os.environ.get("TANDEM_RANK", os.environ.get("TANDEM_EMU_HOST"))
        if env is None:
            ap.error("--rank not given and neither TANDEM_RANK nor TANDEM_EMU_HOST is set")
        a.rank = int(env)
    addrs = a.addrs.split(",")
    ring = Ring(a.rank, addrs, a.port)
    n = len(addrs)
    rc = 0
    for size in (parse_size(s) for s in a.sizes.split(",")):
        count = max(1, size // 4)
        buf = np.empty(count, np.float32)
        tmp = np.empty(count, np.float32)
        for _ in range(max(1, a.warmup)):
            buf.fill(a.rank + 1)
            ring.allreduce(buf, tmp)
        wrong = int(np.count_nonzero(buf != n * (n + 1) / 2))
        times = []
        for _ in range(a.iters):
            ring.barrier()
            t0 = time.perf_counter()
            ring.allreduce(buf, tmp)
            times.append(time.perf_counter() - t0)
        if wrong:
            rc = 1
        print(json.dumps({"rank": a.rank, "bytes": count * 4, "world": n, "times_s": times, "wrong": wrong}),
              flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
