"""PyTorch's torch.distributed over Tandem: `import tandem.torch` registers the backend "tandem".

    import torch.distributed as dist, tandem.torch
    dist.init_process_group("tandem")          # env:// as usual: tandem launch (or torchrun) sets the variables
    model = torch.nn.parallel.DistributedDataParallel(model)   # an unchanged DDP script

Run with `tandem launch -n 4 -- /usr/bin/python3 train.py`. CPU tensors of float32/64, float16, bfloat16,
int32/64 and uint8; allreduce (sum, avg, min, max, product), broadcast, allgather, reduce, reduce_scatter, barrier,
send/recv -- what DDP and the usual scripts call.

Why Python and not a C++ extension: PyTorch (1.13 and 2.x alike) lets a Python subclass of ProcessGroup stand in for
a C++ one (its PyProcessGroup trampoline dispatches DDP's C++ calls to the Python methods), and Tandem's C ABI is
already reachable from Python (ctypes, zero-copy on the tensors' memory). So nothing is compiled against the
installed PyTorch, which would tie the package to one PyTorch build and need a compiler at first import. The cost is
a Python call per collective (a few microseconds; DDP issues one per gradient bucket).

Transport: tcp unless TANDEM_TRANSPORT says otherwise. "auto" would pick UCX, whose waits busy-poll (2 ms): beside
PyTorch's compute on shared cores that cost LeNet-5 DDP 2-3x its throughput here (bench/torch/README.md).

Threads: the C ABI wants the calls on one communicator serialized, so every operation runs on one worker thread per
process group, in call order (as the ranks must issue them); the caller gets a Work whose future completes when the
worker has finished -- DDP's backward keeps computing while buckets are reduced, as with gloo.
"""
import atexit
import itertools
import os
import queue
import secrets
import socket
import threading
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist

from . import Communicator

BACKEND = "tandem"

_DTYPES = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.int32: "i32",
           torch.int64: "i64", torch.uint8: "u8"}
_OPS = (("SUM", "sum"), ("AVG", "avg"), ("MIN", "min"), ("MAX", "max"), ("PRODUCT", "prod"))


def _op(reduce_op):
    for torch_name, name in _OPS:
        if hasattr(dist.ReduceOp, torch_name) and reduce_op == getattr(dist.ReduceOp, torch_name):
            return name
    raise ValueError("tandem backend: reduce op %s is not supported (sum, avg, min, max, product)" % (reduce_op,))


class _View:
    """A numpy view of a CPU tensor's memory (a contiguous copy, written back by finish(), when it is not
    contiguous) and the Tandem dtype name to go with it."""

    def __init__(self, t):
        if t.device.type != "cpu":
            raise ValueError("tandem backend: only CPU tensors for now, got one on %s" % t.device)
        self.tensor = t
        self.work = t if t.is_contiguous() else t.contiguous()
        if t.dtype == torch.bfloat16:
            self.array, self.dtype = self.work.view(torch.int16).numpy(), "bf16"
        elif t.dtype in _DTYPES:
            self.array, self.dtype = self.work.numpy(), _DTYPES[t.dtype]
        else:
            raise ValueError("tandem backend: dtype %s is not supported" % t.dtype)
        self.array = self.array.reshape(-1)

    def finish(self):
        if self.work is not self.tensor:
            self.tensor.copy_(self.work)


class _Work(dist.Work):
    """One operation's handle: its future completes (with `result`) once the worker thread ran it."""

    def __init__(self, result):
        super().__init__()
        self._future = torch.futures.Future()
        self._result = result

    def _complete(self, error):
        if error is None:
            self._future.set_result(self._result)
        else:
            self._future.set_exception(error)

    def wait(self, timeout=None):
        self._future.wait()  # raises the operation's error
        return True

    def get_future(self):
        return self._future

    def is_completed(self):
        return self._future.done()

    def is_success(self):
        if not self._future.done():
            return False
        try:
            self._future.value()
        except Exception:
            return False
        return True

    def result(self):
        return self._result


class ProcessGroupTandem(dist.ProcessGroup):
    """A torch.distributed process group whose collectives are Tandem's (one Tandem communicator per group)."""

    def __init__(self, store, rank, world_size, timeout=timedelta(minutes=30)):
        super().__init__(rank, world_size)
        self._rank, self._world = rank, world_size
        timeout_ms = max(1, int(timeout.total_seconds() * 1000)) if timeout else None
        if world_size == 1:
            self._comm = Communicator(rank=0, size=1)
        else:
            # The group's own rendezvous: rank 0 picks a port and, unless the launcher gave one, a secret, and hands
            # both out through PyTorch's store (torch's own rendezvous already uses MASTER_PORT).
            if rank == 0:
                store.set("tandem/port", str(_free_port()))
                store.set("tandem/secret", os.environ.get("TANDEM_SECRET") or secrets.token_hex(32))
            port = int(store.get("tandem/port"))
            secret = store.get("tandem/secret").decode()
            addr = os.environ.get("TANDEM_MASTER_ADDR") or os.environ.get("MASTER_ADDR") or "127.0.0.1"
            self._comm = Communicator(rank=rank, size=world_size, master_addr=addr, master_port=port, secret=secret,
                                      timeout_ms=timeout_ms, transport=os.environ.get("TANDEM_TRANSPORT") or "tcp")
        self._queue = queue.SimpleQueue()
        self._worker = threading.Thread(target=self._run, name="tandem-pg-%d" % rank, daemon=True)
        self._worker.start()
        _LIVE[next(_SERIAL)] = self

    # -- the worker ----------------------------------------------------------------------------------
    def _run(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, work = item
            error = None
            try:
                fn()
            except Exception as e:  # TandemError, or a bad argument found late
                error = e
            work._complete(error)

    def _submit(self, fn, result):
        work = _Work(result)
        self._queue.put((fn, work))
        return work

    def shutdown(self):
        if self._worker.is_alive():
            self._queue.put(None)
            self._worker.join()
        self._comm.close()

    def __del__(self):
        try:
            self.shutdown()
        except Exception:
            pass

    # -- what PyTorch asks of a process group ---------------------------------------------------------
    def getBackendName(self):
        return BACKEND

    def _get_backend_name(self):
        return BACKEND

    def name(self):
        return BACKEND

    def size(self):
        return self._world

    def rank(self):
        return self._rank

    def _each(self, tensors, call, write_back=True):
        """Runs call(view) for each tensor on the worker; a view that is a copy is written back when asked."""
        views = [_View(t) for t in tensors]

        def run():
            for v in views:
                call(v)
                if write_back:
                    v.finish()
        return self._submit(run, tensors)

    def allreduce(self, tensors, opts=None):
        op = _op(opts.reduceOp) if opts is not None else "sum"
        return self._each(tensors, lambda v: self._comm.allreduce(v.array, op=op, dtype=v.dtype))

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts):
        root = opts.rootRank
        return self._each(tensors, lambda v: self._comm.broadcast(v.array, root=root, dtype=v.dtype))

    def allgather(self, output_lists, inputs, opts=None):
        pairs = []
        for outs, t in zip(output_lists, inputs):
            if len(outs) != self._world or any(o.numel() != t.numel() or o.dtype != t.dtype for o in outs):
                raise ValueError("tandem backend: allgather needs %d outputs shaped like the input" % self._world)
            pairs.append((outs, _View(t)))

        def run():
            for outs, v in pairs:
                flat = torch.empty(self._world * v.array.size, dtype=v.tensor.dtype)
                self._comm.allgather(v.array, _View(flat).array, dtype=v.dtype)
                for i, o in enumerate(outs):
                    o.copy_(flat[i * v.array.size:(i + 1) * v.array.size].view_as(o))
        return self._submit(run, output_lists)

    def _allgather_base(self, output, input, opts=None):
        out, v = _View(output), _View(input)

        def run():
            self._comm.allgather(v.array, out.array, dtype=v.dtype)
            out.finish()
        return self._submit(run, [output])

    def reduce(self, tensors, opts):
        op, root = _op(opts.reduceOp), opts.rootRank
        return self._each(tensors, lambda v: self._comm.reduce(v.array, root=root, op=op, dtype=v.dtype),
                          write_back=self._rank == root)

    def reduce_scatter(self, outputs, input_lists, opts):
        op = _op(opts.reduceOp)
        pairs = [(_View(o), ins) for o, ins in zip(outputs, input_lists)]

        def run():
            for out, ins in pairs:
                send = torch.cat([t.reshape(-1) for t in ins])
                self._comm.reduce_scatter(_View(send).array, out.array, op=op, dtype=out.dtype)
                out.finish()
        return self._submit(run, outputs)

    def barrier(self, opts=None):
        return self._submit(self._comm.barrier, [])

    def send(self, tensors, dst, tag):
        return self._each(tensors, lambda v: self._comm.send(v.array, dst, tag=tag, dtype=v.dtype), write_back=False)

    def recv(self, tensors, src, tag):
        return self._each(tensors, lambda v: self._comm.recv(v.array, src, tag=tag, dtype=v.dtype))


# Groups not yet shut down. PyTorch keeps them alive until the interpreter ends, when a communicator torn down during
# finalization (its worker thread already frozen) aborts the process: close them all first, newest first.
_LIVE = weakref.WeakValueDictionary()
_SERIAL = itertools.count()


@atexit.register
def _shutdown_all():
    for _, pg in sorted(_LIVE.items(), reverse=True):
        try:
            pg.shutdown()
        except Exception:
            pass


def _free_port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _create(store, rank, world_size, timeout):
    return ProcessGroupTandem(store, rank, world_size, timeout)


def _register():
    if hasattr(dist.Backend, BACKEND.upper()):
        return
    try:
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])  # PyTorch 2.x
    except TypeError:
        dist.Backend.register_backend(BACKEND, _create)  # PyTorch 1.13


_register()
