"""Loading libtandem.so and declaring the C ABI for ctypes (tandem.h is the reference)."""
import ctypes
import glob
import os

TANDEM_VERSION = 500  # the header version these bindings were written against (0.5.0)

c_size_t = ctypes.c_size_t
c_int32 = ctypes.c_int32
c_status = ctypes.c_int32
c_void_p = ctypes.c_void_p
c_char_p = ctypes.c_char_p


class CommParams(ctypes.Structure):
    _fields_ = [
        ("field_mask", ctypes.c_uint64),
        ("rank", c_int32),
        ("size", c_int32),
        ("master_addr", c_char_p),
        ("secret", c_char_p),
        ("transport", c_char_p),
        ("master_port", c_int32),
        ("allreduce_algo", c_int32),
        ("timeout_ms", ctypes.c_int64),
        ("deterministic", c_int32),
    ]


PARAM_RANK = 1 << 0
PARAM_SIZE = 1 << 1
PARAM_MASTER_ADDR = 1 << 2
PARAM_MASTER_PORT = 1 << 3
PARAM_SECRET = 1 << 4
PARAM_TRANSPORT = 1 << 5
PARAM_TIMEOUT_MS = 1 << 6
PARAM_ALLREDUCE_ALGO = 1 << 7
PARAM_DETERMINISTIC = 1 << 8


# The library's soname: 0.x versions put the minor version in it (a minor version may break the ABI).
SONAME = "libtandem.so.%d.%d" % (TANDEM_VERSION // 10000, TANDEM_VERSION // 100 % 100)


def _candidates():
    env = os.environ.get("TANDEM_LIBRARY")
    if env:
        yield env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    for name in ("libtandem.so", SONAME):
        yield os.path.join(here, name)
    # Installed by `cmake --install --prefix P`: the library in P's libdir, wherever P is.
    try:
        from . import _installed
        yield os.path.join(here, _installed.LIBDIR, SONAME)
    except ImportError:
        pass
    # An in-tree build: <repo>/build/<preset>/lib/libtandem.so, the most recently built first.
    repo = os.path.abspath(os.path.join(here, "..", "..", ".."))
    built = glob.glob(os.path.join(repo, "build", "*", "lib", "libtandem.so"))
    yield from sorted(built, key=os.path.getmtime, reverse=True)
    yield SONAME  # the system loader's search path (an installed library)


def load():
    tried = []
    for path in _candidates():
        if os.path.sep in path and not os.path.exists(path):
            tried.append(path + " (missing)")
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
            continue
        _declare(lib)
        return lib, path
    raise ImportError("tandem: cannot load libtandem.so; set TANDEM_LIBRARY to its path. Tried: " + "; ".join(tried))


def _fn(lib, name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)


def _declare(lib):
    P = ctypes.POINTER
    _fn(lib, "tandem_version", ctypes.c_uint32)
    _fn(lib, "tandem_version_string", c_char_p)
    _fn(lib, "tandem_status_string", c_char_p, c_status)
    _fn(lib, "tandem_last_error_message", c_char_p)
    _fn(lib, "tandem_dtype_size", c_size_t, c_int32)
    _fn(lib, "tandem_context_create_v", c_status, ctypes.c_uint32, c_void_p, P(c_void_p))
    _fn(lib, "tandem_context_destroy", None, c_void_p)
    _fn(lib, "tandem_comm_create", c_status, c_void_p, P(CommParams), P(c_void_p))
    _fn(lib, "tandem_comm_split", c_status, c_void_p, c_int32, c_int32, P(c_void_p))
    _fn(lib, "tandem_comm_shrink", c_status, c_void_p, P(c_void_p))
    _fn(lib, "tandem_comm_destroy", None, c_void_p)
    _fn(lib, "tandem_comm_rank", c_status, c_void_p, P(c_int32))
    _fn(lib, "tandem_comm_size", c_status, c_void_p, P(c_int32))
    _fn(lib, "tandem_comm_transport_name", c_status, c_void_p, P(c_char_p))
    _fn(lib, "tandem_comm_allreduce_algo", c_status, c_void_p, c_size_t, c_int32, P(c_int32))
    _fn(lib, "tandem_algo_string", c_char_p, c_int32)
    _fn(lib, "tandem_comm_get_async_status", c_status, c_void_p, P(c_status), c_char_p, P(c_size_t))
    _fn(lib, "tandem_comm_abort", c_status, c_void_p, c_char_p)
    buf, cnt, dt, op, root, tag, req = c_void_p, c_size_t, c_int32, c_int32, c_int32, ctypes.c_uint32, P(c_void_p)
    for prefix, extra in (("tandem_comm_", ()), ("tandem_comm_i", (req,))):
        _fn(lib, prefix + "allreduce", c_status, c_void_p, buf, buf, cnt, dt, op, *extra)
        _fn(lib, prefix + "reduce_scatter", c_status, c_void_p, buf, buf, cnt, dt, op, *extra)
        _fn(lib, prefix + "allgather", c_status, c_void_p, buf, buf, cnt, dt, *extra)
        _fn(lib, prefix + "broadcast", c_status, c_void_p, buf, cnt, dt, root, *extra)
        _fn(lib, prefix + "reduce", c_status, c_void_p, buf, buf, cnt, dt, op, root, *extra)
        _fn(lib, prefix + "barrier", c_status, c_void_p, *extra)
        _fn(lib, prefix + "send", c_status, c_void_p, buf, cnt, dt, root, tag, *extra)
        _fn(lib, prefix + "recv", c_status, c_void_p, buf, cnt, dt, root, tag, *extra)
    _fn(lib, "tandem_request_test", c_status, c_void_p, P(ctypes.c_int))
    _fn(lib, "tandem_request_wait", c_status, c_void_p)
    _fn(lib, "tandem_request_destroy", None, c_void_p)
