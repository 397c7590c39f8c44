#!/usr/bin/env python3
"""Two hosts exchange N bytes each way per step over one persistent TCP connection (as tandem's tcp transport
does). Host B starts each step DELTA seconds after host A. Prints, per step, when each side's incoming message
completed, relative to its sender's start."""
import socket, sys, threading, time, json

GAP = 0.3


def connect(role, peer, port):
    """Host a listens on PORT, host b connects to PEER:PORT: one TCP connection, Nagle off."""
    if role == "a":
        srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); srv.bind(("0.0.0.0", port)); srv.listen(1)
        s, _ = srv.accept()
    else:
        for _ in range(100):
            try:
                s = socket.create_connection((peer, port)); break
            except OSError:
                time.sleep(0.05)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def receiver(s, steps, nbytes, t0, done):
    """A started thread that receives `steps` messages of `nbytes` and appends each one's completion time relative to
    its step's start (t0 + k x GAP) to `done`."""
    def rx():
        for k in range(steps):
            got = 0
            while got < nbytes:
                b = s.recv(min(1 << 20, nbytes - got))
                if not b: return
                got += len(b)
            done.append(time.time() - (t0 + k * GAP))
    th = threading.Thread(target=rx); th.start()
    return th


def main():
    role, peer, port, nbytes, delta, steps, t0 = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6]), float(sys.argv[7])
    s = connect(role, peer, port)
    my_off = 0.0 if role == "a" else delta
    peer_off = delta if role == "a" else 0.0
    done = []
    th = receiver(s, steps, nbytes, t0 + peer_off, done)
    msg = b"x" * nbytes
    for k in range(steps):
        at = t0 + k * GAP + my_off
        while time.time() < at: time.sleep(min(0.001, max(0, at - time.time())))
        s.sendall(msg)
    th.join()
    print(json.dumps({"role": role, "delta": delta, "in_ms": [round(x * 1e3, 2) for x in done]}))


if __name__ == "__main__":
    main()
