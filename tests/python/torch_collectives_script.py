"""Run by `tandem launch -n N -- /usr/bin/python3 torch_collectives_script.py`: torch.distributed's collectives on
the "tandem" backend (tandem.torch), checked against what they must give. Prints 'PASS rank r of n' per rank."""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bindings", "python"))
import tandem.torch  # noqa: E402,F401


def main():
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

    # a non-contiguous tensor is reduced in place all the same
    m = torch.full((8, 6), float(r + 1))
    col = m[:, 1]
    dist.all_reduce(col)
    assert torch.all(m[:, 1] == n * (n + 1) / 2) and torch.all(m[:, 0] == r + 1), m

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

    dist.barrier()
    print("PASS rank %d of %d" % (r, n), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
