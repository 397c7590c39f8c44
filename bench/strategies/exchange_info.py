#!/usr/bin/env python3
"""exchange_pair.py with the kernel's view of the connection (issue #13, asgd): both hosts send N bytes each way per
step over one TCP connection, starting together; a sampler reads getsockopt(TCP_INFO) every 2 ms and each step
records the deltas of the sender's chrono counters -- busy, rwnd_limited, sndbuf_limited (tcp_info, Linux >= 4.10)
-- and the congestion window, RTT, unacked segments and peer's receive window. Prints one JSON line.

  exchange_info.py a|b PEER PORT NBYTES STEPS T0
"""
import json, socket, struct, sys, threading, time

role, peer, port, nbytes, steps, t0 = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
from exchange_pair import GAP, connect, receiver

s = connect(role, peer, port)

def info():
    b = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
    u32 = lambda o: struct.unpack_from("I", b, o)[0]
    u64 = lambda o: struct.unpack_from("Q", b, o)[0]
    return {"unacked": u32(24), "rtt_us": u32(68), "cwnd": u32(80), "mss": u32(16), "retrans": u32(100),
            "acked": u64(120), "busy_us": u64(168), "rwnd_lim_us": u64(176), "sndbuf_lim_us": u64(184),
            "snd_wnd": u32(228), "notsent": u32(144)}


samples, done, steps_info = [], [], []
stop = False
def sampler():
    while not stop:
        samples.append((time.time(), info()))
        time.sleep(0.002)
th = receiver(s, steps, nbytes, t0, done)
sm = threading.Thread(target=sampler); sm.start()
msg = b"x" * nbytes
for k in range(steps):
    at = t0 + k * GAP
    while time.time() < at: time.sleep(min(0.001, max(0, at - time.time())))
    before = info()
    s.sendall(msg)
    while info()["acked"] - before["acked"] < nbytes and time.time() < at + 0.25: time.sleep(0.001)
    after = info()
    steps_info.append({"start": before, "end": after, "acked_ms": round((time.time() - at) * 1e3, 2)})
th.join()
stop = True; sm.join()
trace = [{"t_ms": round((t - t0) * 1e3, 2), **i} for t, i in samples]
print(json.dumps({"role": role, "in_ms": [round(x * 1e3, 2) for x in done], "steps": steps_info, "trace": trace}))
