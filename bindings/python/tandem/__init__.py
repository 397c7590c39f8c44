"""Tandem collectives from Python: ctypes over libtandem.so's C ABI, zero-copy on numpy arrays.

    import numpy as np, tandem
    comm = tandem.Communicator()          # rank, size and rendezvous from the environment
    x = np.ones(1024, dtype=np.float32)
    comm.allreduce(x, op="sum")           # in place
    req = comm.iallreduce(x); ...; req.wait()

Run it with `tandem launch -n 4 -- python3 script.py`. Every failure raises TandemError, carrying
the C status (`.status`, `.status_name`) and the library's message (`.message`).
"""
import ctypes
import operator

from . import _lib

try:
    import numpy as _np
except ImportError:  # the bindings work on any buffer-protocol object without numpy
    _np = None

_LIB, LIBRARY_PATH = _lib.load()

# tandem_status_t
OK = 0
IN_PROGRESS = 1
ERR_INVALID_ARGUMENT = 2
ERR_UNSUPPORTED = 3
ERR_OUT_OF_MEMORY = 4
ERR_TRANSPORT = 5
ERR_BACKEND = 6
ERR_TIMEOUT = 7
ERR_INTERNAL = 8
ERR_MISMATCH = 9
ERR_PEER_FAILURE = 10
ERR_IO = 11
ERR_AUTH = 12

# tandem_dtype_t and tandem_op_t
F32, F64, F16, BF16, I32, I64, U8 = range(7)
_DTYPE_NAMES = {"f32": F32, "float32": F32, "f64": F64, "float64": F64, "f16": F16, "float16": F16,
                "bf16": BF16, "bfloat16": BF16, "i32": I32, "int32": I32, "i64": I64, "int64": I64,
                "u8": U8, "uint8": U8}
_OPS = {"sum": 0, "avg": 1, "mean": 1, "min": 2, "max": 3, "prod": 4}
_ALGOS = {"auto": 0, "ring": 1, "hd": 2, "halving_doubling": 2, "tree": 3, "hier": 4, "hierarchical": 4,
          "direct": 5, "det": 6, "deterministic": 6}
# (memoryview format character, item size) -> dtype, for buffers that are not numpy arrays
_FORMATS = {("f", 4): F32, ("d", 8): F64, ("e", 2): F16, ("i", 4): I32, ("l", 4): I32, ("l", 8): I64,
            ("q", 8): I64, ("B", 1): U8, ("b", 1): U8, ("c", 1): U8}


class TandemError(Exception):
    """A failed Tandem call: `status` (int, a tandem_status_t), `status_name`, `message`."""

    def __init__(self, status, message):
        self.status = int(status)
        self.status_name = status_string(self.status)
        self.message = message
        super().__init__("%s: %s" % (self.status_name, message))


def status_string(status):
    return _LIB.tandem_status_string(int(status)).decode()


def version():
    return _LIB.tandem_version_string().decode()


def _check(status):
    if status != OK:
        raise TandemError(status, _LIB.tandem_last_error_message().decode(errors="replace"))


def _invalid(message):
    return TandemError(ERR_INVALID_ARGUMENT, message)


def _set_field(struct, field, value, conv):
    """struct.field = conv(value), for a params struct. An integer field takes only whole numbers within its C type:
    ctypes silently truncated 64.9 to 64 and wrapped 2**32 + 2 to 2 in an int32 (dp=2**32+2 simulated dp 2)."""
    if conv is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        try:
            whole = operator.index(value)  # int, bool, numpy integers; not 64.9 nor "64"
        except TypeError:
            raise _invalid("%s must be a whole number, got %r" % (field, value)) from None
        ctype = dict(type(struct)._fields_)[field]
        bits = 8 * ctypes.sizeof(ctype)
        lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if ctype(-1).value == -1 else (0, (1 << bits) - 1)
        if not lo <= whole <= hi:
            raise _invalid("%s = %d is out of range for its C field (%d .. %d)" % (field, whole, lo, hi))
        value = whole
    else:
        value = conv(value)
    setattr(struct, field, value)


def _op_code(op):
    if isinstance(op, int):
        return op  # the library validates the number
    try:
        return _OPS[op]
    except KeyError:
        raise _invalid("unknown op %r (expected one of %s)" % (op, ", ".join(sorted(_OPS)))) from None


def _dtype_code(dtype):
    if isinstance(dtype, int):
        return dtype
    try:
        return _DTYPE_NAMES[str(dtype)]
    except KeyError:
        raise _invalid("unknown dtype %r (expected one of %s)" % (dtype, ", ".join(sorted(_DTYPE_NAMES)))) from None


class _Buffer:
    """A contiguous buffer's address, element count and dtype; keeps what it points into alive."""

    __slots__ = ("ptr", "count", "dtype", "owner", "keep")

    def __init__(self, obj, what, writable, dtype=None):
        self.owner = obj
        self.keep = obj
        if _np is not None and isinstance(obj, _np.ndarray):
            if not obj.flags.c_contiguous:
                raise _invalid("%s must be C-contiguous (numpy.ascontiguousarray makes a copy)" % what)
            if writable and not obj.flags.writeable:
                raise _invalid("%s is read-only but receives results" % what)
            if dtype is None:
                dtype = _DTYPE_NAMES.get(obj.dtype.name)
                if dtype is None:
                    raise _invalid("%s has numpy dtype %s, which Tandem does not reduce (float32, float64, float16, "
                                   "int32, int64, uint8; bf16 as uint16 with dtype='bf16')" % (what, obj.dtype))
            else:
                dtype = _dtype_code(dtype)
                if dtype == BF16 and obj.itemsize != 2:
                    raise _invalid("%s: dtype bf16 needs 2-byte elements (a uint16 array), got %s" % (what, obj.dtype))
            self.ptr = obj.ctypes.data if obj.size else None
            self.count = int(obj.size)
            self.dtype = dtype
            return
        try:
            mv = memoryview(obj)
        except TypeError:
            raise _invalid("%s must be a numpy array or support the buffer protocol, got %s" %
                           (what, type(obj).__name__)) from None
        if not mv.c_contiguous:
            raise _invalid("%s must be contiguous" % what)
        if dtype is None:
            dtype = _FORMATS.get((mv.format.lstrip("@=<"), mv.itemsize))
            if dtype is None:
                raise _invalid("%s has buffer format %r, which Tandem does not reduce" % (what, mv.format))
        else:
            dtype = _dtype_code(dtype)
        self.dtype = dtype
        self.count = mv.nbytes // max(1, mv.itemsize)
        if mv.nbytes == 0:
            self.ptr = None
        elif not mv.readonly:
            self.keep = ctypes.c_char.from_buffer(mv.cast("B"))
            self.ptr = ctypes.addressof(self.keep)
        elif writable:
            raise _invalid("%s is read-only but receives results" % what)
        else:
            self.keep = ctypes.create_string_buffer(mv.tobytes(), mv.nbytes)
            self.ptr = ctypes.addressof(self.keep)


def _like(buf, count, what):
    """A new array for results, shaped (count,) with the dtype of `buf` (needs numpy)."""
    if _np is None or not isinstance(buf.owner, _np.ndarray):
        raise _invalid("%s must be given when the input is not a numpy array" % what)
    return _np.empty(count, dtype=buf.owner.dtype)


def _same_dtype(a, b, what):
    if a.dtype != b.dtype:
        raise _invalid("%s has dtype %d but the input has %d" % (what, b.dtype, a.dtype))


def _expect_count(buf, count, what):
    if buf.count != count:
        raise _invalid("%s has %d elements, expected %d" % (what, buf.count, count))


class _Context:
    def __init__(self):
        h = ctypes.c_void_p()
        _check(_LIB.tandem_context_create_v(_lib.TANDEM_VERSION, None, ctypes.byref(h)))
        self.handle = h

    def __del__(self):
        if self.handle and _LIB is not None:
            _LIB.tandem_context_destroy(self.handle)
            self.handle = None


class Request:
    """A non-blocking operation. Its buffers stay in use until it completes; `wait()` returns the
    result array (the same object the blocking form returns)."""

    def __init__(self, comm, handle, result, keep):
        self._comm = comm  # keeps the context alive
        self._handle = handle
        self._result = result
        self._keep = keep

    def test(self):
        """True once complete; raises TandemError if the operation failed."""
        if not self._handle:
            return True
        done = ctypes.c_int(0)
        _check(_LIB.tandem_request_test(self._handle, ctypes.byref(done)))
        return bool(done.value)

    def wait(self):
        if self._handle:
            _check(_LIB.tandem_request_wait(self._handle))
        return self._result

    def close(self):
        """Releases the request (waiting for it first if it is still in flight)."""
        if self._handle and _LIB is not None:
            _LIB.tandem_request_destroy(self._handle)
        self._handle = None
        self._keep = None

    __del__ = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Communicator:
    """A group of ranks running collectives. Unset arguments come from the environment
    (TANDEM_*, torchrun's, Open MPI's or Slurm's variables); with none, a one-rank job."""

    def __init__(self, rank=None, size=None, master_addr=None, master_port=None, secret=None, transport=None,
                 timeout_ms=None, algo=None, deterministic=None, _handle=None, _ctx=None):
        self._ctx = _ctx or _Context()
        self._handle = None
        if _handle is None:
            p = _lib.CommParams()
            m = 0
            if rank is not None:
                _set_field(p, "rank", rank, int)
                m |= _lib.PARAM_RANK
            if size is not None:
                _set_field(p, "size", size, int)
                m |= _lib.PARAM_SIZE
            if master_addr is not None:
                p.master_addr, m = master_addr.encode(), m | _lib.PARAM_MASTER_ADDR
            if master_port is not None:
                _set_field(p, "master_port", master_port, int)
                m |= _lib.PARAM_MASTER_PORT
            if secret is not None:
                p.secret, m = secret.encode(), m | _lib.PARAM_SECRET
            if transport is not None:
                p.transport, m = transport.encode(), m | _lib.PARAM_TRANSPORT
            if timeout_ms is not None:
                _set_field(p, "timeout_ms", timeout_ms, int)
                m |= _lib.PARAM_TIMEOUT_MS
            if algo is not None:
                if isinstance(algo, str):
                    if algo not in _ALGOS:
                        raise _invalid("unknown algo %r (expected one of %s)" % (algo, ", ".join(sorted(_ALGOS))))
                    algo = _ALGOS[algo]
                p.allreduce_algo, m = int(algo), m | _lib.PARAM_ALLREDUCE_ALGO
            if deterministic is not None:
                p.deterministic, m = int(bool(deterministic)), m | _lib.PARAM_DETERMINISTIC
            p.field_mask = m
            h = ctypes.c_void_p()
            _check(_LIB.tandem_comm_create(self._ctx.handle, ctypes.byref(p), ctypes.byref(h)))
            _handle = h
        self._handle = _handle
        r, n = ctypes.c_int32(), ctypes.c_int32()
        _check(_LIB.tandem_comm_rank(self._handle, ctypes.byref(r)))
        _check(_LIB.tandem_comm_size(self._handle, ctypes.byref(n)))
        self.rank, self.size = r.value, n.value
        name = ctypes.c_char_p()
        _check(_LIB.tandem_comm_transport_name(self._handle, ctypes.byref(name)))
        self.transport = name.value.decode()

    # -- lifetime --------------------------------------------------------------------------------
    def close(self):
        if self._handle and _LIB is not None:
            _LIB.tandem_comm_destroy(self._handle)
        self._handle = None

    __del__ = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _h(self):
        if not self._handle:
            raise _invalid("the communicator is closed")
        return self._handle

    def __repr__(self):
        return "<tandem.Communicator rank %d of %d over %s>" % (self.rank, self.size, self.transport)

    # -- groups and state --------------------------------------------------------------------------
    def split(self, color, key=0):
        """Collective: ranks with equal color form a new communicator ordered by (key, rank).
        A negative color joins no group and returns None."""
        h = ctypes.c_void_p()
        _check(_LIB.tandem_comm_split(self._h(), int(color), int(key), ctypes.byref(h)))
        return Communicator(_handle=h, _ctx=self._ctx) if h.value else None

    def allreduce_algo(self, count, dtype="f32"):
        """The algorithm an allreduce of `count` elements uses ("ring", "hd", ...)."""
        a = ctypes.c_int32()
        _check(_LIB.tandem_comm_allreduce_algo(self._h(), int(count), _dtype_code(dtype), ctypes.byref(a)))
        return _LIB.tandem_algo_string(a.value).decode()

    def async_status(self):
        """(status, message) of the communicator's first failure; (OK, "") while healthy."""
        s = ctypes.c_int32()
        buf = ctypes.create_string_buffer(1024)
        n = ctypes.c_size_t(len(buf))
        _check(_LIB.tandem_comm_get_async_status(self._h(), ctypes.byref(s), buf, ctypes.byref(n)))
        return s.value, buf.value.decode(errors="replace")

    def abort(self, reason="aborted by the application"):
        _check(_LIB.tandem_comm_abort(self._h(), reason.encode()))

    # -- collectives (blocking forms return the result array; i-forms return a Request) ------------
    def _start(self, nonblocking, name, args, result, keep):
        if nonblocking:
            h = ctypes.c_void_p()
            _check(getattr(_LIB, "tandem_comm_i" + name)(self._h(), *args, ctypes.byref(h)))
            return Request(self, h, result, keep)
        _check(getattr(_LIB, "tandem_comm_" + name)(self._h(), *args))
        return result

    def _allreduce(self, nb, array, op, out, dtype):
        src = _Buffer(array, "array", writable=out is None, dtype=dtype)
        dst = src
        if out is not None:
            dst = _Buffer(out, "out", writable=True, dtype=dtype)
            _same_dtype(src, dst, "out")
            _expect_count(dst, src.count, "out")
        res = array if out is None else out
        return self._start(nb, "allreduce", (src.ptr, dst.ptr, src.count, src.dtype, _op_code(op)), res, (src, dst))

    def allreduce(self, array, op="sum", out=None, dtype=None):
        """Reduces `array` over all ranks, in place (or into `out`); returns the result array."""
        return self._allreduce(False, array, op, out, dtype)

    def iallreduce(self, array, op="sum", out=None, dtype=None):
        return self._allreduce(True, array, op, out, dtype)

    def _reduce_scatter(self, nb, send, recv, op, dtype):
        src = _Buffer(send, "send", writable=False, dtype=dtype)
        if src.count % self.size:
            raise _invalid("send has %d elements, not a multiple of the communicator size %d" % (src.count, self.size))
        per = src.count // self.size
        if recv is None:
            recv = _like(src, per, "recv")
        dst = _Buffer(recv, "recv", writable=True, dtype=dtype)
        _same_dtype(src, dst, "recv")
        _expect_count(dst, per, "recv")
        return self._start(nb, "reduce_scatter", (src.ptr, dst.ptr, per, src.dtype, _op_code(op)), recv, (src, dst))

    def reduce_scatter(self, send, recv=None, op="sum", dtype=None):
        """send: size*k elements; returns recv (k elements): this rank's block of the reduction."""
        return self._reduce_scatter(False, send, recv, op, dtype)

    def ireduce_scatter(self, send, recv=None, op="sum", dtype=None):
        return self._reduce_scatter(True, send, recv, op, dtype)

    def _allgather(self, nb, send, recv, dtype):
        src = _Buffer(send, "send", writable=False, dtype=dtype)
        if recv is None:
            recv = _like(src, src.count * self.size, "recv")
        dst = _Buffer(recv, "recv", writable=True, dtype=dtype)
        _same_dtype(src, dst, "recv")
        _expect_count(dst, src.count * self.size, "recv")
        return self._start(nb, "allgather", (src.ptr, dst.ptr, src.count, src.dtype), recv, (src, dst))

    def allgather(self, send, recv=None, dtype=None):
        """Returns recv (size*k elements): every rank's `send` (k elements) in rank order."""
        return self._allgather(False, send, recv, dtype)

    def iallgather(self, send, recv=None, dtype=None):
        return self._allgather(True, send, recv, dtype)

    def _broadcast(self, nb, array, root, dtype):
        b = _Buffer(array, "array", writable=True, dtype=dtype)
        return self._start(nb, "broadcast", (b.ptr, b.count, b.dtype, int(root)), array, (b,))

    def broadcast(self, array, root=0, dtype=None):
        """Copies root's `array` into every rank's `array` (in place); returns it."""
        return self._broadcast(False, array, root, dtype)

    def ibroadcast(self, array, root=0, dtype=None):
        return self._broadcast(True, array, root, dtype)

    def _reduce(self, nb, array, root, op, out, dtype):
        is_root = int(root) == self.rank
        src = _Buffer(array, "array", writable=is_root and out is None, dtype=dtype)
        dst = None
        if is_root:
            dst = src if out is None else _Buffer(out, "out", writable=True, dtype=dtype)
            _same_dtype(src, dst, "out")
            _expect_count(dst, src.count, "out")
        res = (array if out is None else out) if is_root else None
        args = (src.ptr, dst.ptr if dst else None, src.count, src.dtype, _op_code(op), int(root))
        return self._start(nb, "reduce", args, res, (src, dst))

    def reduce(self, array, root=0, op="sum", out=None, dtype=None):
        """The reduction over ranks lands on `root` (in place, or in `out`); returns it on root, None elsewhere."""
        return self._reduce(False, array, root, op, out, dtype)

    def ireduce(self, array, root=0, op="sum", out=None, dtype=None):
        return self._reduce(True, array, root, op, out, dtype)

    def barrier(self):
        self._start(False, "barrier", (), None, ())

    def ibarrier(self):
        return self._start(True, "barrier", (), None, ())

    def _p2p(self, nb, name, array, peer, tag, dtype):
        b = _Buffer(array, "array", writable=name == "recv", dtype=dtype)
        return self._start(nb, name, (b.ptr, b.count, b.dtype, int(peer), int(tag)), array, (b,))

    def send(self, array, peer, tag=0, dtype=None):
        self._p2p(False, "send", array, peer, tag, dtype)

    def isend(self, array, peer, tag=0, dtype=None):
        return self._p2p(True, "send", array, peer, tag, dtype)

    def recv(self, array, peer, tag=0, dtype=None):
        """Receives into `array` from `peer` (matching its send's tag and size); returns it."""
        return self._p2p(False, "recv", array, peer, tag, dtype)

    def irecv(self, array, peer, tag=0, dtype=None):
        return self._p2p(True, "recv", array, peer, tag, dtype)


__all__ = ["Communicator", "Request", "TandemError", "version", "status_string", "LIBRARY_PATH"]
