"""Training from Python through the C ABI's training section (tandem.h, "Training").

    import tandem.train as tt
    model = tt.Model("lenet5", seed=1)                   # or tt.Model(spec_path="net.json") / spec_json=...
    train = tt.Dataset("fashion-mnist", train=True)
    test = tt.Dataset("fashion-mnist", train=False)
    opt = tt.Optimizer("sgd", lr=0.01, momentum=0.9)
    trainer = tt.Trainer(model, train, test, opt, batch_size=64)
    print(trainer.epoch())                                # {'epoch': 1, 'train_loss': ..., 'test_accuracy': ...}
    trainer.save_checkpoint("run.ckpt")

Parallel training, one process per rank (`tandem launch -n 3 -- python3 script.py`): every rank creates the same
trainer over the job's communicator, with a strategy and its own keywords (Trainer's docstring lists them):

    import tandem
    comm = tandem.Communicator()                          # rank and world from the launcher
    trainer = tt.Trainer(model, train, test, opt, batch_size=64, strategy="ssp", servers=1, staleness=2, comm=comm)
    # "ps", "ps-async", "ssp" (servers: the last ranks), "asgd", "easgd" (tau, alpha, easgd_async), "fedavg" (clients,
    # client_fraction, local_epochs, dirichlet_alpha, round_deadline_s), "localsgd" (average_every, warmup_steps),
    # "ddp", "pipeline", "hybrid" (dp, pp, micro_batches); another strategy's keyword raises TandemError naming it

Failures raise tandem.TandemError (status and the library's message).
"""
import ctypes
import os
import math

from . import _LIB, _check, _invalid, _set_field

try:
    import numpy as _np
except ImportError:
    _np = None

P = ctypes.POINTER
_u64, _i64, _i32, _f32, _f64 = ctypes.c_uint64, ctypes.c_int64, ctypes.c_int32, ctypes.c_float, ctypes.c_double
_str, _ptr, _size = ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t


class _ModelParams(ctypes.Structure):
    _fields_ = [("field_mask", _u64), ("name", _str), ("spec_path", _str), ("spec_json", _str),
                ("input_channels", _i64), ("input_height", _i64), ("input_width", _i64), ("num_classes", _i64),
                ("width_mult", _f64), ("backend", _str), ("seed", _u64), ("init", _str)]


class _ModelAttr(ctypes.Structure):
    _fields_ = [("field_mask", _u64), ("name", _str), ("backend", _str), ("input_channels", _i64),
                ("input_height", _i64), ("input_width", _i64), ("num_classes", _i64), ("num_layers", _size),
                ("params", _i64), ("buffers", _i64), ("macs", _i64), ("fwd_flops", _f64), ("bwd_flops", _f64),
                ("activation_bytes", _i64), ("held_first_layer", _size), ("held_end_layer", _size),
                ("held_params", _i64)]


class _LayerAttr(ctypes.Structure):
    _fields_ = [("field_mask", _u64), ("name", _str), ("kind", _str), ("num_inputs", _i32), ("inputs", _i32 * 2),
                ("out_channels", _i64), ("out_height", _i64), ("out_width", _i64), ("params", _i64), ("macs", _i64),
                ("fwd_flops", _f64), ("bwd_flops", _f64), ("activation_bytes", _i64)]


class _DatasetParams(ctypes.Structure):
    _fields_ = [("field_mask", _u64), ("kind", _str), ("path", _str), ("labels_path", _str), ("train", _i32),
                ("limit", _i64), ("channels", _i64), ("height", _i64), ("width", _i64), ("num_classes", _i64),
                ("count", _i64), ("seed", _u64)]


class _OptimizerParams(ctypes.Structure):
    _fields_ = [("field_mask", _u64), ("kind", _i32), ("lr", _f32), ("momentum", _f32), ("dampening", _f32),
                ("nesterov", _i32), ("weight_decay", _f32), ("beta1", _f32), ("beta2", _f32), ("eps", _f32),
                ("schedule", _str), ("clip_norm", _f64)]


class _Progress(ctypes.Structure):
    _fields_ = [("epoch", _i64), ("batch", _i64), ("batches", _i64), ("loss", _f64), ("images_per_sec", _f64),
                ("elapsed_s", _f64)]


_PROGRESS_FN = ctypes.CFUNCTYPE(None, P(_Progress), _ptr)


class _TrainerParams(ctypes.Structure):
    _fields_ = [("field_mask", _u64), ("batch_size", _i64), ("epochs", _i64), ("seed", _u64),
                ("limit_batches", _i64), ("eval_limit_batches", _i64), ("augment", _i32), ("prefetch", _i32),
                ("progress", _PROGRESS_FN), ("progress_user_data", _ptr), ("normalize", _i32),
                ("loss_scale", _f64), ("loss_scale_init", _f64), ("loss_scale_growth", _f64),
                ("loss_scale_backoff", _f64), ("loss_scale_growth_interval", _i64)]


class _StepResult(ctypes.Structure):
    _fields_ = [("field_mask", _u64), ("loss", _f64), ("correct", _i64), ("samples", _i64), ("lr", _f32),
                ("epoch_end", _i32)]


class _EpochResult(ctypes.Structure):
    _fields_ = [("field_mask", _u64), ("epoch", _i64), ("train_loss", _f64), ("train_accuracy", _f64),
                ("train_samples", _i64), ("test_loss", _f64), ("test_accuracy", _f64), ("images_per_sec", _f64),
                ("train_s", _f64), ("wall_s", _f64), ("already_reported", _i32)]


class _ParallelParams(ctypes.Structure):
    _fields_ = [("field_mask", _u64), ("strategy", _i32), ("dp", _i32), ("pp", _i32), ("micro_batches", _i32),
                ("schedule", _i32), ("bucket_mb", _f64), ("compression", _i32), ("accumulation", _i32),
                ("partition", _i32), ("boundaries", P(_i32)), ("num_boundaries", _size), ("trace", _i32),
                ("servers", _i32), ("staleness", _i32), ("tau", _i32), ("alpha", _f64), ("easgd_async", _i32),
                ("clients", _i32), ("dirichlet_alpha", _f64), ("client_fraction", _f64), ("local_epochs", _i32),
                ("round_deadline_s", _f64), ("average_every", _i32), ("warmup_steps", _i32),
                ("elastic", _i32), ("min_ranks", _i32), ("elastic_checkpoint", _str), ("max_ranks", _i32),
                ("join_poll_steps", _i32), ("joining", _i32), ("server_replicas", _i32),
                ("first_bucket_mb", _f64), ("bucket_sizes_mb", P(_f64)), ("num_bucket_sizes", _size),
                ("staleness_lr", _i32)]


# tandem_strategy_t's names, and each parallel keyword: (field_mask bit, field or fields, type). A keyword left at
# None keeps the library's default; a bit covering several fields takes every field of it from its keyword or the
# library's default (DEFAULTS).
STRATEGIES = {"single": 0, "ddp": 1, "pipeline": 2, "hybrid": 3, "ps": 4, "ps-async": 5, "ssp": 6, "asgd": 7,
              "easgd": 8, "fedavg": 9, "localsgd": 10}
STALENESS_LR = {"none": 0, "inverse": 1, "momentum": 2}  # tandem_staleness_lr_t's names (ps-async)
_PARALLEL_KWARGS = {"dp": (1, int), "pp": (1, int), "micro_batches": (2, int), "bucket_mb": (4, float),
                    "accumulation": (6, int), "servers": (10, int), "staleness": (11, int), "tau": (12, int),
                    "alpha": (12, float), "easgd_async": (12, bool), "clients": (13, int),
                    "dirichlet_alpha": (13, float), "client_fraction": (13, float), "local_epochs": (13, int),
                    "round_deadline_s": (13, float), "average_every": (14, int), "warmup_steps": (14, int),
                    "elastic": (15, bool), "min_ranks": (15, int), "elastic_checkpoint": (15, bytes),
                    "max_ranks": (16, int), "join_poll_steps": (16, int), "joining": (16, bool),
                    "server_replicas": (17, int), "first_bucket_mb": (18, float), "bucket_sizes_mb": (18, list),
                    "staleness_lr": (19, str)}
_PARALLEL_DEFAULTS = {"dp": 0, "pp": 0, "servers": 1, "staleness": 2, "tau": 4, "alpha": 0.0, "easgd_async": False,
                      "clients": 0, "dirichlet_alpha": 0.0, "client_fraction": 1.0, "local_epochs": 1,
                      "round_deadline_s": 0.0, "average_every": 8, "warmup_steps": 0, "elastic": False, "min_ranks": 1,
                      "elastic_checkpoint": None, "max_ranks": 0, "join_poll_steps": 0, "joining": False,
                      "server_replicas": 0, "first_bucket_mb": 0.0, "bucket_sizes_mb": None, "staleness_lr": "none"}


def _parallel_params(strategy, kwargs):
    if strategy not in STRATEGIES:
        raise _invalid("unknown strategy %r (expected one of %s)" % (strategy, ", ".join(STRATEGIES)))
    unknown = sorted(set(kwargs) - set(_PARALLEL_KWARGS))
    if unknown:
        raise _invalid("unknown parallel option(s) %s (expected some of %s)" %
                       (", ".join(unknown), ", ".join(_PARALLEL_KWARGS)))
    p = _ParallelParams(field_mask=1, strategy=STRATEGIES[strategy])
    bits = {_PARALLEL_KWARGS[k][0] for k, v in kwargs.items() if v is not None}
    for name, (bit, conv) in _PARALLEL_KWARGS.items():
        if bit not in bits:
            continue
        p.field_mask |= 1 << bit
        value = kwargs.get(name)
        if value is None:
            value = _PARALLEL_DEFAULTS.get(name, 0)
        if conv is bytes:  # a path: kept alive by the structure's own reference until the call returns
            setattr(p, name, None if value is None else os.fsencode(value))
        elif conv is bool:
            setattr(p, name, int(bool(value)))
        elif conv is str:  # an enum by name
            if value not in STALENESS_LR:
                raise _invalid("%s=%r is not one of %s" % (name, value, ", ".join(STALENESS_LR)))
            setattr(p, name, STALENESS_LR[value])
        elif conv is list:  # sizes in MiB: a C array kept alive by the structure until the call returns
            sizes = [] if value is None else [float(x) for x in value]
            p._bucket_sizes = (_f64 * max(1, len(sizes)))(*sizes)
            p.bucket_sizes_mb = ctypes.cast(p._bucket_sizes, P(_f64))
            p.num_bucket_sizes = len(sizes)
        else:  # whole numbers in the C field's range (staleness=2**32 + 1 wrapped to 1)
            _set_field(p, name, value, conv)
    return p


def _fn(name, restype, *argtypes):
    f = getattr(_LIB, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


_status = ctypes.c_int32
_fn("tandem_model_create", _status, _ptr, P(_ModelParams), P(_ptr))
_fn("tandem_model_destroy", None, _ptr)
_fn("tandem_model_query", _status, _ptr, P(_ModelAttr))
_fn("tandem_model_layer_query", _status, _ptr, _size, P(_LayerAttr))
_fn("tandem_model_get_params", _status, _ptr, P(_f32), _size)
_fn("tandem_model_set_params", _status, _ptr, P(_f32), _size)
_fn("tandem_model_forward", _status, _ptr, P(_f32), _i64, P(_f32), _size)
_fn("tandem_dataset_create", _status, _ptr, P(_DatasetParams), P(_ptr))
_fn("tandem_dataset_destroy", None, _ptr)
_fn("tandem_dataset_info", _status, _ptr, P(_i64), P(_i64), P(_i64), P(_i64), P(_i64))
_fn("tandem_optimizer_create", _status, _ptr, P(_OptimizerParams), P(_ptr))
_fn("tandem_optimizer_destroy", None, _ptr)
_fn("tandem_trainer_create", _status, _ptr, _ptr, _ptr, _ptr, P(_TrainerParams), P(_ptr))
_fn("tandem_trainer_create_parallel", _status, _ptr, _ptr, _ptr, _ptr, P(_TrainerParams), P(_ParallelParams), _ptr,
    P(_ptr))
_fn("tandem_trainer_destroy", None, _ptr)
_fn("tandem_trainer_step", _status, _ptr, P(_StepResult))
_fn("tandem_trainer_epoch", _status, _ptr, P(_EpochResult))
_fn("tandem_trainer_evaluate", _status, _ptr, _ptr, _i64, P(_f64), P(_f64))
_fn("tandem_trainer_save_checkpoint", _status, _ptr, _str)
_fn("tandem_trainer_load_checkpoint", _status, _ptr, _str)
_fn("tandem_trainer_progress", _status, _ptr, P(_i64), P(_i64))

ZOO = ("mlp", "lenet5", "resnet18", "mobilenetv2", "vgg16", "alexnet", "resnet18_imagenet", "resnet50", "resnet101",
       "vgg16_imagenet", "mobilenetv2_imagenet", "alexnet_imagenet", "inception_v3", "bert_base")
_OPTIMIZERS = {"sgd": 0, "adam": 1, "adamw": 2}


class _Context:
    """One library context shared by the objects of this module (compute threads: num_threads)."""
    _handle = None

    @classmethod
    def get(cls):
        if cls._handle is None:
            h = _ptr()
            _check(_LIB.tandem_context_create_v(100, None, ctypes.byref(h)))
            cls._handle = h
        return cls._handle


def set_num_threads(n):
    """Compute threads for models created afterwards (0: all cores). Call before creating models."""
    if _Context._handle is not None:
        raise _invalid("set_num_threads must be called before the first model or dataset is created")

    class _ContextParams(ctypes.Structure):
        _fields_ = [("field_mask", _u64), ("num_threads", _i32), ("log_sink", _ptr), ("log_user_data", _ptr),
                    ("log_level", _i32)]
    p = _ContextParams(field_mask=1, num_threads=int(n))
    h = _ptr()
    _check(_LIB.tandem_context_create_v(100, ctypes.byref(p), ctypes.byref(h)))
    _Context._handle = h


def _b(s):
    return None if s is None else str(s).encode()


def _fill(p, keep, fields):
    """Sets each (field_mask bit, struct field or tuple of fields, value, type) whose value is not None and marks its
    bit; strings are encoded and kept alive in `keep` for as long as the call that reads `p`."""
    for bit, field, value, conv in fields:
        if value is None:
            continue
        p.field_mask |= 1 << bit
        if isinstance(field, tuple):
            values = list(value)
            if len(values) != len(field):
                raise _invalid("%s needs %d values, got %r" % ("/".join(field), len(field), value))
            for f, v in zip(field, values):
                _set_field(p, f, v, conv)
        elif conv is str:
            keep.append(_b(value))
            setattr(p, field, keep[-1])
        else:
            _set_field(p, field, value, conv)
    return p


class _Handle:
    _destroy = None

    def __init__(self):
        self._h = _ptr()

    def close(self):
        if self._h:
            type(self)._destroy(self._h)
            self._h = _ptr()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Model(_Handle):
    """A zoo model (`name`) or a JSON spec (`spec_path` / `spec_json`) on a compute backend ("cpu", "reference",
    "cuda", or "none" for a spec only)."""
    _destroy = _LIB.tandem_model_destroy

    def __init__(self, name=None, *, spec_path=None, spec_json=None, input_shape=None, num_classes=None,
                 width_mult=None, backend="cpu", seed=0, init="kaiming"):
        super().__init__()
        keep = []
        p = _fill(_ModelParams(), keep, [
            (0, "name", name, str), (1, "spec_path", spec_path, str), (2, "spec_json", spec_json, str),
            (3, ("input_channels", "input_height", "input_width"), input_shape, int),
            (4, "num_classes", num_classes, int), (5, "width_mult", width_mult, float),
            (6, "backend", backend, str), (7, "seed", seed, int), (8, "init", init, str)])
        _check(_LIB.tandem_model_create(_Context.get(), ctypes.byref(p), ctypes.byref(self._h)))

    def info(self):
        a = _ModelAttr(field_mask=15)
        _check(_LIB.tandem_model_query(self._h, ctypes.byref(a)))
        return {"name": a.name.decode(), "backend": a.backend.decode(),
                "held_layers": (a.held_first_layer, a.held_end_layer), "held_params": a.held_params,
                "input_shape": (a.input_channels, a.input_height, a.input_width), "num_classes": a.num_classes,
                "num_layers": a.num_layers, "params": a.params, "buffers": a.buffers, "macs": a.macs,
                "fwd_flops": a.fwd_flops, "bwd_flops": a.bwd_flops, "activation_bytes": a.activation_bytes}

    def layers(self):
        out = []
        for i in range(self.info()["num_layers"]):
            a = _LayerAttr(field_mask=7)
            _check(_LIB.tandem_model_layer_query(self._h, i, ctypes.byref(a)))
            out.append({"name": a.name.decode(), "type": a.kind.decode(), "inputs": list(a.inputs[:a.num_inputs]),
                        "output": (a.out_channels, a.out_height, a.out_width), "params": a.params, "macs": a.macs,
                        "fwd_flops": a.fwd_flops, "bwd_flops": a.bwd_flops, "activation_bytes": a.activation_bytes})
        return out

    def get_params(self):
        """The parameters the model holds as a float32 numpy array (a copy): all of them, or its stage's once a
        pipeline trainer made it hold one stage (info()["held_layers"])."""
        n = self.info()["held_params"]
        out = _np.empty(n, dtype=_np.float32)
        _check(_LIB.tandem_model_get_params(self._h, out.ctypes.data_as(P(_f32)), n))
        return out

    def set_params(self, values):
        v = _np.ascontiguousarray(values, dtype=_np.float32).reshape(-1)
        _check(_LIB.tandem_model_set_params(self._h, v.ctypes.data_as(P(_f32)), v.size))

    def forward(self, x):
        """Logits [N, classes] for normalised float32 inputs [N, C, H, W] (inference mode)."""
        x = _np.ascontiguousarray(x, dtype=_np.float32)
        info = self.info()
        # The C function reads batch x C x H x W floats from the pointer: an input of another shape would be read
        # past its end (or read in part), so it is checked here.
        per_sample = int(_np.prod(info["input_shape"]))
        if x.ndim < 2 or x.shape[0] < 1 or x.size != x.shape[0] * per_sample:
            raise _invalid("forward: model '%s' takes inputs [N, %s] (%d values per sample), got an array of shape %s"
                           % (info["name"], ", ".join(str(d) for d in info["input_shape"]), per_sample, x.shape))
        n = int(x.shape[0])
        out = _np.empty((n, info["num_classes"]), dtype=_np.float32)
        _check(_LIB.tandem_model_forward(self._h, x.ctypes.data_as(P(_f32)), n, out.ctypes.data_as(P(_f32)),
                                         out.size))
        return out


class Dataset(_Handle):
    """"fashion-mnist" (found automatically), "cifar10" (path required), "idx" (path + labels_path) or "synthetic"."""
    _destroy = _LIB.tandem_dataset_destroy

    def __init__(self, kind="fashion-mnist", *, train=True, path=None, labels_path=None, limit=None, shape=None,
                 num_classes=None, count=None, seed=None):
        super().__init__()
        keep = []
        p = _fill(_DatasetParams(), keep, [
            (0, "kind", kind, str), (1, "path", path, str), (2, "labels_path", labels_path, str),
            (3, "train", 1 if train else 0, int), (4, "limit", limit, int),
            (5, ("channels", "height", "width"), shape, int), (6, "num_classes", num_classes, int),
            (7, "count", count, int), (8, "seed", seed, int)])
        _check(_LIB.tandem_dataset_create(_Context.get(), ctypes.byref(p), ctypes.byref(self._h)))

    def __len__(self):
        n = _i64()
        _check(_LIB.tandem_dataset_info(self._h, ctypes.byref(n), None, None, None, None))
        return n.value

    def info(self):
        v = [_i64() for _ in range(5)]
        _check(_LIB.tandem_dataset_info(self._h, *(ctypes.byref(x) for x in v)))
        return {"size": v[0].value, "shape": (v[1].value, v[2].value, v[3].value), "num_classes": v[4].value}


class Optimizer(_Handle):
    """An optimizer configuration: "sgd" (momentum, dampening, nesterov), "adam", "adamw"; weight_decay, a schedule
    ("constant", "step:E:G", "cosine", optionally ",warmup:E") and gradient clipping by global norm."""
    _destroy = _LIB.tandem_optimizer_destroy

    def __init__(self, kind="sgd", *, lr=0.01, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0,
                 betas=(0.9, 0.999), eps=1e-8, schedule="constant", clip_norm=0.0):
        super().__init__()
        if kind not in _OPTIMIZERS:
            raise _invalid("unknown optimizer %r (expected sgd, adam or adamw)" % (kind,))
        self._schedule = _b(schedule)
        p = _OptimizerParams(field_mask=(1 << 10) - 1, kind=_OPTIMIZERS[kind], lr=lr, momentum=momentum,
                             dampening=dampening, nesterov=1 if nesterov else 0, weight_decay=weight_decay,
                             beta1=betas[0], beta2=betas[1], eps=eps, schedule=self._schedule,
                             clip_norm=float(clip_norm))
        _check(_LIB.tandem_optimizer_create(_Context.get(), ctypes.byref(p), ctypes.byref(self._h)))


def _launched_world(name=False):
    """The world size a launcher announced (tandem launch, torchrun, mpirun, srun, MPICH), else 1; or its variable."""
    for v in ("TANDEM_WORLD_SIZE", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS", "PMI_SIZE"):
        try:
            n = int(os.environ.get(v, ""))
        except ValueError:
            continue
        return "%s=%d" % (v, n) if name else n
    return "" if name else 1


class Trainer(_Handle):
    """Runs steps, epochs, evaluation and checkpoints. Keeps its model and datasets alive. `progress`, if given, is
    called with a dict after every batch of an epoch.

    Parallel training (tandem_trainer_create_parallel): give `strategy` ("ddp", "pipeline", "hybrid", "ps",
    "ps-async", "ssp", "asgd", "easgd", "fedavg", "localsgd") and `comm`, a tandem.Communicator (None: a one-rank job;
    refused under a launcher that announced more ranks), plus
    keywords of tandem_parallel_params_t: dp, pp, micro_batches, bucket_mb, accumulation, servers, staleness, tau,
    alpha, easgd_async, clients, dirichlet_alpha, client_fraction, local_epochs, round_deadline_s, average_every,
    warmup_steps, elastic, min_ranks, elastic_checkpoint, max_ranks, join_poll_steps, joining, server_replicas,
    first_bucket_mb, bucket_sizes_mb (a list of MiB: the first buckets' sizes in gradient-ready order), staleness_lr
    ("none", "inverse": ps-async divides each push's rate by its staleness, or "momentum": lowers its momentum).
    A strategy's own keywords (servers: ps, ps-async, ssp and easgd with easgd_async; staleness: ssp; staleness_lr:
    ps-async; tau, alpha, easgd_async: easgd; clients .. round_deadline_s: fedavg; average_every, warmup_steps:
    localsgd) given to another strategy raise TandemError naming the field, as do more FedAvg clients than training
    samples.
    Every rank creates its trainer with the same settings."""
    _destroy = _LIB.tandem_trainer_destroy

    def __init__(self, model, train, test=None, optimizer=None, *, batch_size=64, epochs=1, seed=0,
                 limit_batches=0, eval_limit_batches=0, augment=False, prefetch=2, normalize=True, progress=None,
                 strategy=None, comm=None, **parallel):
        super().__init__()
        optimizer = optimizer or Optimizer()
        if strategy is None and (comm is not None or parallel):
            raise _invalid("parallel options need a strategy (e.g. strategy=\"ddp\")")
        pp = _parallel_params(strategy, parallel) if strategy is not None else None
        if pp is not None and comm is None and _launched_world() > 1:
            # NULL runs a one-rank job: under `tandem launch -n 2` every rank trained alone, silently
            raise _invalid("strategy %r on one of %d launched ranks (%s) without comm: every rank would train alone; "
                           "pass comm=tandem.Communicator()" % (strategy, _launched_world(), _launched_world(True)))
        self._keep = (model, train, test, optimizer, comm)
        self._progress_cb = None
        p = _TrainerParams(field_mask=0x17f, batch_size=batch_size, epochs=epochs, seed=seed,
                           limit_batches=limit_batches, eval_limit_batches=eval_limit_batches,
                           augment=1 if augment else 0, prefetch=prefetch, normalize=1 if normalize else 0)
        if progress is not None:
            def cb(pp, _user):
                q = pp.contents
                progress({"epoch": q.epoch, "batch": q.batch, "batches": q.batches, "loss": q.loss,
                          "images_per_sec": q.images_per_sec, "elapsed_s": q.elapsed_s})
            self._progress_cb = _PROGRESS_FN(cb)
            p.field_mask |= 1 << 7
            p.progress = self._progress_cb
        if pp is not None:
            _check(_LIB.tandem_trainer_create_parallel(model._h, train._h, test._h if test is not None else None,
                                                       optimizer._h, ctypes.byref(p), ctypes.byref(pp),
                                                       comm._handle if comm is not None else None,
                                                       ctypes.byref(self._h)))
            return
        _check(_LIB.tandem_trainer_create(model._h, train._h, test._h if test is not None else None, optimizer._h,
                                          ctypes.byref(p), ctypes.byref(self._h)))

    def step(self):
        r = _StepResult(field_mask=7)
        _check(_LIB.tandem_trainer_step(self._h, ctypes.byref(r)))
        return {"loss": r.loss, "correct": r.correct, "samples": r.samples, "lr": r.lr, "epoch_end": bool(r.epoch_end)}

    def epoch(self):
        """Trains the rest of the epoch and evaluates. already_reported: an elastic job's survivors get True for an
        epoch that a rank which has since left already reported (it was rank 0 then): do not print it again."""
        r = _EpochResult(field_mask=15)
        _check(_LIB.tandem_trainer_epoch(self._h, ctypes.byref(r)))
        nan = lambda v: None if math.isnan(v) else v
        # train_loss, train_accuracy: None when no sample was scored in the epoch (the library's NaN)
        return {"epoch": r.epoch, "train_loss": nan(r.train_loss), "train_accuracy": nan(r.train_accuracy),
                "train_samples": r.train_samples, "test_loss": nan(r.test_loss),
                "test_accuracy": nan(r.test_accuracy), "images_per_sec": r.images_per_sec, "train_s": r.train_s,
                "wall_s": r.wall_s, "already_reported": bool(r.already_reported)}

    def evaluate(self, dataset, limit_batches=0):
        loss, acc = _f64(), _f64()
        _check(_LIB.tandem_trainer_evaluate(self._h, dataset._h, int(limit_batches), ctypes.byref(loss),
                                            ctypes.byref(acc)))
        return {"loss": loss.value, "accuracy": acc.value}

    def save_checkpoint(self, path):
        _check(_LIB.tandem_trainer_save_checkpoint(self._h, _b(path)))

    def load_checkpoint(self, path):
        _check(_LIB.tandem_trainer_load_checkpoint(self._h, _b(path)))

    @property
    def completed_epochs(self):
        e = _i64()
        _check(_LIB.tandem_trainer_progress(self._h, ctypes.byref(e), None))
        return e.value

    @property
    def steps(self):
        s = _i64()
        _check(_LIB.tandem_trainer_progress(self._h, None, ctypes.byref(s)))
        return s.value
