"""Run by `tandem launch -n N -- /usr/bin/python3 torch_collectives_script.py`: torch.distributed's collectives on
the "tandem" backend (tandem.torch), checked against what they must give; then bad calls, which must raise an
exception naming the operation on every rank and never hang. Prints 'PASS rank r of n (impl)' per rank.
TANDEM_TORCH_IMPL (cpp or python), when set, must be the implementation in use."""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bindings", "python"))
import tandem.torch  # noqa: E402,F401


def expect_error(what, words, fn):
    try:
        fn()
    except Exception as e:  # RuntimeError, ValueError or TandemError, depending on where it was found
        text = str(e)
        missing = [w for w in words if w not in text]
        assert not missing, "%s: error %r does not name %s" % (what, text, missing)
        return
    raise AssertionError("%s: no error" % what)


def check_errors(r, n):
    # Found locally (every rank passes the same bad argument): nothing is sent, the group stays usable.
    expect_error("non-contiguous", ["allreduce", "contiguous"],
                 lambda: dist.all_reduce(torch.ones(4, 6)[:, 1]))
    expect_error("wrong output size", ["all_gather_into_tensor", "elements"],
                 lambda: dist.all_gather_into_tensor(torch.empty(2 * n + 1), torch.ones(2)))
    expect_error("wrong input size", ["reduce_scatter_tensor", "elements"],
                 lambda: dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * n - 1)))
    expect_error("wrong output list", ["allgather"],
                 lambda: dist.all_gather([torch.empty(2)] * (n + 1), torch.ones(2)))
    expect_error("unsupported op", ["all_to_all_single", "not supported"],
                 lambda: dist.all_to_all_single(torch.empty(n), torch.ones(n)))
    expect_error("unsupported dtype", ["allreduce", "dtype"],
                 lambda: dist.all_reduce(torch.ones(3, dtype=torch.int8)))
    x = torch.ones(5)
    dist.all_reduce(x)
    assert torch.all(x == n), x

    # Found by the ranks together: sizes differ between ranks. Tandem's message headers catch it on every rank; the
    # failed group is a throwaway subgroup so the default one can still say goodbye.
    g = dist.new_group(list(range(n)))
    expect_error("sizes differ between ranks", ["allreduce", "mismatch"],
                 lambda: dist.all_reduce(torch.ones(3 + r), group=g))



def main():
    want = os.environ.get("TANDEM_TORCH_IMPL")
    assert want in (None, "auto", tandem.torch.IMPL), (want, tandem.torch.IMPL)
    dist.init_process_group("tandem")
    r, n = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "tandem", dist.get_backend()
    ranks = torch.arange(n, dtype=torch.float64)

    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64):
        x = (torch.arange(100) % 7 + r).to(dtype)
        dist.all_reduce(x)
        want = ((torch.arange(100) % 7) * n + n * (n - 1) // 2).to(dtype)
        assert torch.equal(x, want), (dtype, x[:5], want[:5])
    for op, fn in ((dist.ReduceOp.MIN, torch.min), (dist.ReduceOp.MAX, torch.max), (dist.ReduceOp.PRODUCT, torch.prod)):
        x = torch.full((33,), r + 1.0, dtype=torch.float64)
        dist.all_reduce(x, op=op)
        assert torch.all(x == fn(ranks + 1)), (op, x[0])

    # asynchronous: several in flight, completed in order
    xs = [torch.full((1000,), float(r * k), dtype=torch.float32) for k in range(5)]
    works = [dist.all_reduce(x, async_op=True) for x in xs]
    for k, (w, x) in enumerate(zip(works, xs)):
        w.wait()
        assert torch.all(x == k * n * (n - 1) / 2), (k, x[0])

    root = n - 1
    b = torch.full((17,), float(r), dtype=torch.float64)
    dist.broadcast(b, src=root)
    assert torch.all(b == root), b

    out = [torch.empty(3, dtype=torch.int64) for _ in range(n)]
    dist.all_gather(out, torch.tensor([r, r * 10, r * 100]))
    for k in range(n):
        assert out[k].tolist() == [k, k * 10, k * 100], out

    red = torch.full((5,), float(r + 1))
    dist.reduce(red, dst=0)
    if r == 0:
        assert torch.all(red == n * (n + 1) / 2), red

    rs = torch.empty(4)
    dist.reduce_scatter(rs, [torch.full((4,), float(r + k)) for k in range(n)])
    assert torch.all(rs == sum(q + r for q in range(n))), rs

    # the flat-tensor forms (PyTorch >= 1.13: _allgather_base / _reduce_scatter_base underneath)
    if hasattr(dist, "all_gather_into_tensor"):
        flat = torch.empty(2 * n, dtype=torch.int32)
        dist.all_gather_into_tensor(flat, torch.tensor([r, -r], dtype=torch.int32))
        assert flat.tolist() == [v for k in range(n) for v in (k, -k)], flat
    if hasattr(dist, "reduce_scatter_tensor"):
        part = torch.empty(3, dtype=torch.float64)
        dist.reduce_scatter_tensor(part, torch.arange(3 * n, dtype=torch.float64) + r)
        assert part.tolist() == [n * (3 * r + i) + n * (n - 1) / 2 for i in range(3)], part

    # a DDP-style communication hook: the work's future carries the reduced tensors
    fut = dist.all_reduce(torch.full((7,), float(r)), async_op=True).get_future()
    got = fut.wait()
    assert torch.all(got[0] == n * (n - 1) / 2), got

    dist.barrier()

    # a subgroup gets its own communicator
    if n >= 2:
        g = dist.new_group([0, 1])
        if r < 2:
            y = torch.ones(4)
            dist.all_reduce(y, group=g)
            assert torch.all(y == 2), y

    # point to point
    if n >= 2 and r < 2:
        t = torch.full((6,), 42.0) if r == 0 else torch.zeros(6)
        if r == 0:
            dist.send(t, dst=1)
        else:
            dist.recv(t, src=0)
            assert torch.all(t == 42), t

    check_errors(r, n)
    dist.barrier()
    print("PASS rank %d of %d (%s)" % (r, n, tandem.torch.IMPL), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
