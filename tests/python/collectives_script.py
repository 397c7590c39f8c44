"""Run by `tandem launch -n N -- /usr/bin/python3 collectives_script.py`: every collective of the
Python bindings on every rank, checked with numpy. Prints one 'PASS rank r of n' line per rank."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bindings", "python"))
import tandem  # noqa: E402


def main():
    comm = tandem.Communicator()
    r, n = comm.rank, comm.size
    ranks = np.arange(n)

    # allreduce, in place and zero-copy: the array object itself holds the result.
    for dtype in (np.float32, np.float64, np.float16, np.int32, np.int64):
        x = (np.arange(1000) % 5 + 2 * r).astype(dtype)
        ptr = x.ctypes.data
        out = comm.allreduce(x, op="sum")
        assert out is x and x.ctypes.data == ptr
        want = (np.arange(1000) % 5) * n + n * (n - 1)
        assert np.array_equal(x, want.astype(dtype)), (dtype, x[:8], want[:8])
    for op, fn in (("min", np.min), ("max", np.max), ("prod", np.prod), ("avg", np.mean)):
        x = np.full(300, r + 1, dtype=np.float64)
        comm.allreduce(x, op=op)
        assert np.allclose(x, fn(ranks + 1.0)), (op, x[0])

    # bf16 travels as uint16 with dtype='bf16': 1.0 is 0x3f80; the sum of n ones is exact.
    b = np.full(64, 0x3F80, dtype=np.uint16)
    comm.allreduce(b, dtype="bf16")
    got = (b.astype(np.uint32) << 16).view(np.float32)
    assert np.all(got == n), got[:4]

    # out-of-place
    src = np.full(10, float(r), dtype=np.float32)
    dst = np.zeros(10, dtype=np.float32)
    comm.allreduce(src, out=dst)
    assert np.all(src == r) and np.all(dst == ranks.sum())

    # reduce_scatter / allgather
    send = np.arange(n * 7, dtype=np.int64) + r
    recv = comm.reduce_scatter(send)
    assert np.array_equal(recv, np.arange(r * 7, r * 7 + 7) * n + ranks.sum())
    g = comm.allgather(np.full(3, r, dtype=np.int32))
    assert np.array_equal(g, np.repeat(ranks, 3).astype(np.int32))

    # broadcast / reduce
    root = n - 1
    x = np.arange(50, dtype=np.float32) if r == root else np.zeros(50, dtype=np.float32)
    comm.broadcast(x, root=root)
    assert np.array_equal(x, np.arange(50, dtype=np.float32))
    y = np.full(20, r + 1, dtype=np.int32)
    res = comm.reduce(y, root=0, op="sum")
    if r == 0:
        assert res is y and np.all(y == (ranks + 1).sum())
    else:
        assert res is None and np.all(y == r + 1)  # the input is untouched off the root

    # non-blocking, several in flight
    xs = [np.full(5000, k + r, dtype=np.float32) for k in range(3)]
    reqs = [comm.iallreduce(a) for a in xs]
    for k in reversed(range(3)):
        assert reqs[k].wait() is xs[k]
        assert np.all(xs[k] == n * k + ranks.sum())
        assert reqs[k].test()
        reqs[k].close()
    req = comm.ibarrier()
    req.wait()

    # point to point around a ring
    nxt, prv = (r + 1) % n, (r - 1) % n
    s = comm.isend(np.full(100, r, dtype=np.int64), nxt, tag=3)
    got = comm.recv(np.zeros(100, dtype=np.int64), prv, tag=3)
    s.wait()
    assert np.all(got == prv)

    # split into even and odd ranks
    sub = comm.split(r % 2, key=r)
    assert sub.size == len([q for q in range(n) if q % 2 == r % 2])
    v = sub.allreduce(np.array([r], dtype=np.int64))
    assert v[0] == sum(q for q in range(n) if q % 2 == r % 2), v
    sub.close()
    none = comm.split(-1 if r == 0 else 1)
    assert (none is None) == (r == 0)
    if none is not None:
        none.barrier()
        none.close()

    # errors raise TandemError with the status, on this rank only, and leave the communicator usable
    try:
        comm.broadcast(np.zeros(4, dtype=np.float32), root=n)
        raise AssertionError("root out of range accepted")
    except tandem.TandemError as e:
        assert e.status == tandem.ERR_INVALID_ARGUMENT and "root" in e.message, e

    assert comm.async_status() == (tandem.OK, "")
    comm.barrier()
    print("PASS rank %d of %d over %s" % (r, n, comm.transport), flush=True)
    comm.close()


if __name__ == "__main__":
    main()
