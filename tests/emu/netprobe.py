#!/usr/bin/python3
"""netprobe: TCP throughput and UDP round-trip probes for the emulated-cluster test (tests/emu).

  netprobe.py tcp-recv PORT SECONDS WARMUP      prints JSON {"mbit": steady-state goodput, ...}
  netprobe.py tcp-send HOST PORT SECONDS [CONGESTION_CONTROL]
  netprobe.py udp-echo PORT SECONDS             echoes datagrams until SECONDS pass or "quit" arrives
  netprobe.py udp-rtt HOST PORT COUNT           prints JSON {"median_ms": ..., ...}
Everything has a deadline; nothing waits forever.
"""
import json
import socket
import statistics
import sys
import time


def bytes_received(sock):
    """The kernel's count of in-order bytes received (tcp_info.tcpi_bytes_received, offset 128): unlike
    what the application has read, it does not jump when this process was briefly descheduled."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return int.from_bytes(info[128:136], "little")


def tcp_recv(port, seconds, warmup):
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("0.0.0.0", port))
    ls.listen(1)
    ls.settimeout(10)
    c, _ = ls.accept()
    c.settimeout(0.02)
    buf = bytearray(1 << 20)
    t_first = start = stop = None
    total = 0
    deadline = time.monotonic() + seconds + 10
    while time.monotonic() < deadline:
        try:
            n = c.recv_into(buf)
            if n == 0:
                break
            total += n
        except socket.timeout:
            pass
        now = time.monotonic()
        if t_first is None and total:
            t_first = now
        # Count after the warm-up (slow start) until `seconds` after the first byte.
        if t_first is not None and start is None and now - t_first >= warmup:
            start = (time.monotonic(), bytes_received(c))
        if start is not None and stop is None and now - t_first >= seconds:
            stop = (time.monotonic(), bytes_received(c))
    c.close()
    mbit = (stop[1] - start[1]) * 8 / (stop[0] - start[0]) / 1e6 if start and stop else 0.0
    print(json.dumps({"mbit": mbit, "bytes": total}))


def tcp_send(host, port, seconds, cc=None):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if cc:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
    s.settimeout(10)
    s.connect((host, port))
    chunk = b"\0" * (1 << 18)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        s.sendall(chunk)
    s.close()


def udp_echo(port, seconds):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", port))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        s.settimeout(max(0.01, end - time.monotonic()))
        try:
            d, a = s.recvfrom(2048)
        except socket.timeout:
            break
        s.sendto(d, a)
        if d == b"quit":
            break


def udp_rtt(host, port, count):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(1.0)
    rtts = []
    for i in range(count):
        msg = b"p%d" % i
        t = time.perf_counter()
        s.sendto(msg, (host, port))
        try:
            while True:
                d, _ = s.recvfrom(2048)
                if d == msg:
                    break
        except socket.timeout:
            continue
        rtts.append((time.perf_counter() - t) * 1e3)
        time.sleep(0.002)
    s.sendto(b"quit", (host, port))
    rtts.sort()
    out = {"n": len(rtts)}
    if rtts:
        out.update(min_ms=rtts[0], median_ms=statistics.median(rtts), p90_ms=rtts[int(0.9 * (len(rtts) - 1))])
    print(json.dumps(out))


if __name__ == "__main__":
    m, a = sys.argv[1], sys.argv[2:]
    if m == "tcp-recv":
        tcp_recv(int(a[0]), float(a[1]), float(a[2]))
    elif m == "tcp-send":
        tcp_send(a[0], int(a[1]), float(a[2]), a[3] if len(a) > 3 else None)
    elif m == "udp-echo":
        udp_echo(int(a[0]), float(a[1]))
    elif m == "udp-rtt":
        udp_rtt(a[0], int(a[1]), int(a[2]))
    else:
        sys.exit(f"netprobe: unknown mode {m}")
