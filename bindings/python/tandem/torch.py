"""PyTorch's torch.distributed over Tandem: `import tandem.torch` registers the backend "tandem".

    import torch.distributed as dist, tandem.torch
    dist.init_process_group("tandem")          # env:// as usual: tandem launch (or torchrun) sets the variables
    model = torch.nn.parallel.DistributedDataParallel(model)   # an unchanged DDP script

Run with `tandem launch -n 4 -- /usr/bin/python3 train.py`. CPU tensors of float32/64, float16, bfloat16,
int32/64 and uint8; allreduce (sum, avg, min, max, product), broadcast, allgather, reduce, reduce_scatter, barrier,
send/recv -- what DDP and the usual scripts call.

Two implementations, one behaviour (the same tests run on both):
  C++   (PyTorch >= 2.0): torch_backend.cpp, a c10d::Backend calling Tandem's C ABI on the tensors' memory from a C++
        worker thread that never takes the GIL. Compiled at first import with torch.utils.cpp_extension (g++ and
        ninja) into ~/.cache/tandem/torch-ext/<torch version>-<hash>/ (TANDEM_TORCH_EXT_DIR overrides), then reused.
  Python: a ProcessGroup subclass over the ctypes bindings (PyTorch's PyProcessGroup trampoline dispatches DDP's C++
        calls to it) with a Python worker thread: each collective costs two GIL handoffs between that thread and
        autograd's, up to milliseconds on oversubscribed cores. Used on PyTorch 1.x (Debian's python3-torch ships no C++
        headers) and wherever the extension cannot be built; the import then warns, naming why.
TANDEM_TORCH_IMPL=python or cpp picks one (cpp: a failed build raises); `tandem.torch.IMPL` says which is in use.

Transport: tcp unless TANDEM_TRANSPORT says otherwise. "auto" would pick UCX, whose waits busy-poll (2 ms): beside
PyTorch's compute on shared cores that cost LeNet-5 DDP 2-3x its throughput here (bench/torch/README.md).

Threads (both): the C ABI wants the calls on one communicator serialized, so every operation runs on one worker thread
per process group, in call order (as the ranks must issue them); the caller gets a Work whose future completes when the
worker has finished -- DDP's backward keeps computing while buckets are reduced, as with gloo.
"""
import atexit
import hashlib
import itertools
import os
import queue
import secrets
import socket
import sys
import threading
import warnings
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist

from . import LIBRARY_PATH, Communicator

BACKEND = "tandem"

_DTYPES = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.int32: "i32",
           torch.int64: "i64", torch.uint8: "u8"}
_OPS = (("SUM", "sum"), ("AVG", "avg"), ("MIN", "min"), ("MAX", "max"), ("PRODUCT", "prod"))


def _op(what, reduce_op):
    for torch_name, name in _OPS:
        if hasattr(dist.ReduceOp, torch_name) and reduce_op == getattr(dist.ReduceOp, torch_name):
            return name
    raise ValueError("tandem backend: %s: reduce op %s is not supported (sum, avg, min, max, product)" %
                     (what, reduce_op))


class _View:
    """A numpy view of a contiguous CPU tensor's memory (zero-copy) and the Tandem dtype name to go with it. `op`
    names the torch.distributed operation in errors."""

    def __init__(self, t, op):
        if not isinstance(t, torch.Tensor):
            raise TypeError("tandem backend: %s: expected a tensor, got %s" % (op, type(t).__name__))
        if t.device.type != "cpu":
            raise ValueError("tandem backend: %s: only CPU tensors for now, got one on %s" % (op, t.device))
        if not t.is_contiguous():
            raise ValueError("tandem backend: %s: the tensor must be contiguous (shape %s, stride %s); "
                             "call .contiguous() first" % (op, tuple(t.shape), t.stride()))
        self.tensor = t
        if t.dtype == torch.bfloat16:
            self.array, self.dtype = t.view(torch.int16).numpy(), "bf16"
        elif t.dtype in _DTYPES:
            self.array, self.dtype = t.numpy(), _DTYPES[t.dtype]
        else:
            raise ValueError("tandem backend: %s: dtype %s is not supported" % (op, t.dtype))
        self.array = self.array.reshape(-1)


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
        self._comm = _communicator(store, rank, world_size, timeout)
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

    def _each(self, op, tensors, call):
        """Runs call(view) for each tensor on the worker."""
        views = [_View(t, op) for t in tensors]

        def run():
            for v in views:
                call(v)
        return self._submit(run, tensors)

    def _check_same(self, op, what, t, like, count):
        if t.dtype != like.dtype or t.numel() != count:
            raise ValueError("tandem backend: %s: %s has %d elements of %s, expected %d of %s" %
                             (op, what, t.numel(), t.dtype, count, like.dtype))

    def allreduce(self, tensors, opts=None):
        op = _op("allreduce", opts.reduceOp) if opts is not None else "sum"
        return self._each("allreduce", tensors, lambda v: self._comm.allreduce(v.array, op=op, dtype=v.dtype))

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts):
        root = opts.rootRank
        return self._each("broadcast", tensors, lambda v: self._comm.broadcast(v.array, root=root, dtype=v.dtype))

    def allgather(self, output_lists, inputs, opts=None):
        pairs = []
        for outs, t in zip(output_lists, inputs):
            if len(outs) != self._world:
                raise ValueError("tandem backend: allgather: %d output tensors for a group of %d" %
                                 (len(outs), self._world))
            for i, o in enumerate(outs):
                self._check_same("allgather", "output %d" % i, o, t, t.numel())
            pairs.append((outs, _View(t, "allgather")))

        def run():
            for outs, v in pairs:
                flat = torch.empty(self._world * v.array.size, dtype=v.tensor.dtype)
                self._comm.allgather(v.array, _View(flat, "allgather").array, dtype=v.dtype)
                for i, o in enumerate(outs):
                    o.copy_(flat[i * v.array.size:(i + 1) * v.array.size].view_as(o))
        return self._submit(run, output_lists)

    def _allgather_base(self, output, input, opts=None):
        op = "all_gather_into_tensor"
        self._check_same(op, "the output", output, input, input.numel() * self._world)
        out, v = _View(output, op), _View(input, op)
        return self._submit(lambda: self._comm.allgather(v.array, out.array, dtype=v.dtype), [output])

    all_gather_single = _allgather_base  # its name in PyTorch >= 2.10's trampoline

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self._allgather_base(o, i, opts) for o, i in zip(outputs, inputs)]
        return works[-1] if works else self.barrier()

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def reduce(self, tensors, opts):
        op, root = _op("reduce", opts.reduceOp), opts.rootRank
        return self._each("reduce", tensors, lambda v: self._comm.reduce(v.array, root=root, op=op, dtype=v.dtype))

    def reduce_scatter(self, outputs, input_lists, opts):
        op = _op("reduce_scatter", opts.reduceOp)
        pairs = []
        for out, ins in zip(outputs, input_lists):
            if len(ins) != self._world:
                raise ValueError("tandem backend: reduce_scatter: %d input tensors for a group of %d" %
                                 (len(ins), self._world))
            for i, t in enumerate(ins):
                self._check_same("reduce_scatter", "input %d" % i, t, out, out.numel())
            pairs.append((_View(out, "reduce_scatter"), ins))

        def run():
            for out, ins in pairs:
                send = torch.cat([t.reshape(-1) for t in ins])
                self._comm.reduce_scatter(_View(send, "reduce_scatter").array, out.array, op=op, dtype=out.dtype)
        return self._submit(run, outputs)

    def _reduce_scatter_base(self, output, input, opts=None):
        name = "reduce_scatter_tensor"
        op = _op(name, opts.reduceOp) if opts is not None else "sum"
        self._check_same(name, "the input", input, output, output.numel() * self._world)
        out, v = _View(output, name), _View(input, name)
        return self._submit(lambda: self._comm.reduce_scatter(v.array, out.array, op=op, dtype=v.dtype), [output])

    reduce_scatter_single = _reduce_scatter_base  # its name in PyTorch >= 2.10's trampoline

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self._reduce_scatter_base(o, i, opts) for o, i in zip(outputs, inputs)]
        return works[-1] if works else self.barrier()

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def barrier(self, opts=None):
        return self._submit(self._comm.barrier, [])

    def send(self, tensors, dst, tag):
        return self._each("send", tensors, lambda v: self._comm.send(v.array, dst, tag=tag, dtype=v.dtype))

    def recv(self, tensors, src, tag):
        return self._each("recv", tensors, lambda v: self._comm.recv(v.array, src, tag=tag, dtype=v.dtype))

    # Collectives Tandem's C ABI does not offer: a clear error on every rank (each rank calls them), never a hang.
    def _unsupported(name):
        def fail(self, *args, **kwargs):
            raise RuntimeError("tandem backend: %s is not supported (allreduce, broadcast, allgather, reduce, "
                               "reduce_scatter, barrier, send, recv are)" % name)
        fail.__name__ = name
        return fail

    gather = _unsupported("gather")
    scatter = _unsupported("scatter")
    alltoall = _unsupported("all_to_all")
    alltoall_base = _unsupported("all_to_all_single")
    all_to_all_single = alltoall_base
    recv_anysource = _unsupported("recv from any source")
    del _unsupported


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


def _communicator(store, rank, world_size, timeout):
    """The group's Tandem communicator. Its own rendezvous: rank 0 picks a port and, unless the launcher gave one, a
    secret, and hands both out through PyTorch's store (torch's own rendezvous already uses MASTER_PORT)."""
    timeout_ms = max(1, int(timeout.total_seconds() * 1000)) if timeout else None
    if world_size == 1:
        return Communicator(rank=0, size=1)
    if rank == 0:
        store.set("tandem/port", str(_free_port()))
        store.set("tandem/secret", os.environ.get("TANDEM_SECRET") or secrets.token_hex(32))
    port = int(store.get("tandem/port"))
    secret = store.get("tandem/secret").decode()
    addr = os.environ.get("TANDEM_MASTER_ADDR") or os.environ.get("MASTER_ADDR") or "127.0.0.1"
    return Communicator(rank=rank, size=world_size, master_addr=addr, master_port=port, secret=secret,
                        timeout_ms=timeout_ms, transport=os.environ.get("TANDEM_TRANSPORT") or "tcp")


# -- the C++ backend ----------------------------------------------------------------------------------------------
_HERE = os.path.dirname(os.path.abspath(__file__))


def _tandem_include_dir():
    """Where tandem/tandem.h is: TANDEM_INCLUDE_DIR, beside the loaded library's prefix, or the source tree."""
    lib_dir = os.path.dirname(os.path.abspath(LIBRARY_PATH)) if os.path.sep in LIBRARY_PATH else ""
    candidates = [os.environ.get("TANDEM_INCLUDE_DIR"), os.path.join(_HERE, "include"),
                  lib_dir and os.path.join(os.path.dirname(lib_dir), "include"),
                  os.path.join(_HERE, "..", "..", "..", "api", "include")]
    for d in candidates:
        if d and os.path.exists(os.path.join(d, "tandem", "tandem.h")):
            return os.path.abspath(d)
    raise RuntimeError("tandem/tandem.h not found (set TANDEM_INCLUDE_DIR); looked in %s" %
                       ", ".join(c for c in candidates if c))


def _build_extension():
    """Compiles (once per PyTorch version, source and library) and imports torch_backend.cpp."""
    if int(torch.__version__.split(".")[0]) < 2:
        raise RuntimeError("PyTorch %s: the C++ backend needs PyTorch >= 2.0 (c10d::Backend)" % torch.__version__)
    if os.path.sep not in LIBRARY_PATH:
        raise RuntimeError("libtandem was found by the loader as %s, not by path: nothing to link against" %
                           LIBRARY_PATH)
    from torch.utils import cpp_extension
    source = os.path.join(_HERE, "torch_backend.cpp")
    include = _tandem_include_dir()
    lib = os.path.realpath(LIBRARY_PATH)
    h = hashlib.sha256()
    for path in (source, os.path.join(include, "tandem", "tandem.h")):
        with open(path, "rb") as f:
            h.update(f.read())
    h.update(lib.encode())
    tag = h.hexdigest()[:16]
    root = os.environ.get("TANDEM_TORCH_EXT_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "tandem", "torch-ext")
    build_dir = os.path.join(root, "%s-py%d%d-%s" % (torch.__version__, *sys.version_info[:2], tag))
    os.makedirs(build_dir, exist_ok=True)
    return cpp_extension.load(name="tandem_torch_backend_" + tag, sources=[source], build_directory=build_dir,
                              extra_include_paths=[include], extra_cflags=["-O2"],
                              extra_ldflags=[lib, "-Wl,-rpath," + os.path.dirname(lib)], verbose=False)


def _load_extension():
    """The compiled extension, or None (after a warning naming why) when the Python backend must do."""
    choice = os.environ.get("TANDEM_TORCH_IMPL", "auto")
    if choice not in ("auto", "cpp", "python"):
        raise ValueError("TANDEM_TORCH_IMPL=%r: expected auto, cpp or python" % choice)
    if choice == "python":
        return None
    try:
        return _build_extension()
    except Exception as e:  # no compiler, no headers, a failed build
        if choice == "cpp":
            raise RuntimeError("tandem.torch: the C++ backend could not be built (TANDEM_TORCH_IMPL=cpp): %s" %
                               e) from e
        reason = str(e).strip().splitlines()
        warnings.warn("tandem.torch: using the Python backend (slower per collective) because the C++ one could not "
                      "be built: %s" % (reason[-1] if reason else type(e).__name__), RuntimeWarning, stacklevel=3)
        return None


_EXT = _load_extension()
IMPL = "cpp" if _EXT is not None else "python"

# C++ backends and the communicators they borrow: stopped, then closed, at exit (see _shutdown_all).
_CPP_GROUPS = []


def _create(store, rank, world_size, timeout):
    if _EXT is None:
        return ProcessGroupTandem(store, rank, world_size, timeout)
    comm = _communicator(store, rank, world_size, timeout)
    backend = _EXT.BackendTandem(comm._handle.value, rank, world_size)
    _CPP_GROUPS.append((backend, comm))
    return backend


@atexit.register
def _shutdown_cpp():
    # Registered after _shutdown_all, so it runs first. The worker must be gone before its communicator is.
    while _CPP_GROUPS:
        backend, comm = _CPP_GROUPS.pop()
        try:
            backend.stop()
            comm.close()
        except Exception:
            pass


def _register():
    if hasattr(dist.Backend, BACKEND.upper()):
        return
    try:
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])  # PyTorch 2.x
    except TypeError:
        dist.Backend.register_backend(BACKEND, _create)  # PyTorch 1.13


_register()
