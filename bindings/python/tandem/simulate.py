"""Cluster simulation from Python through the C ABI's simulation section (tandem.h, "Simulation").

    import tandem.simulate as ts
    cluster = ts.Cluster("t2.micro:4")                    # PRESET:COUNT, a JSON file, or JSON text
    r = ts.simulate(cluster, model="mobilenetv2", dataset="cifar10", batch=256, epochs=10,  # or a tt.Model
                    strategy="ddp", epoch_time_s=252.5)
    print(r.total_time_s, r.speedup, r["nodes"][0]["throttle_start_s"])
    best = ts.plan(cluster, model="resnet18", batch=64, top=3)   # fastest fitting DP x PP configurations
    rows = ts.sweep("t2.micro:1", [1, 2, 4, 8], model="mobilenetv2", strategy="ddp")

A Result behaves like the JSON object `tandem simulate --json` prints (r["step_time_s"]) and exposes
the main figures as attributes. Failures raise tandem.TandemError naming the field that was wrong.
"""
import ctypes
import json as _json

from . import _LIB, _check, _invalid, _lib, _set_field

P = ctypes.POINTER
_u64, _i64, _i32, _f64, _str, _ptr, _size = (ctypes.c_uint64, ctypes.c_int64, ctypes.c_int32, ctypes.c_double,
                                             ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t)


class _JobParams(ctypes.Structure):  # tandem_sim_job_params_t (0.2: typed)
    _fields_ = [("field_mask", _u64), ("model", _ptr), ("dataset", _str), ("samples", _i64), ("batch", _i64),
                ("epochs", _f64), ("strategy", _i32), ("dp", _i32), ("pp", _i32), ("micro_batches", _i32),
                ("schedule", _i32), ("algorithm", _i32), ("bucket_mb", _f64), ("overlap", _i32), ("optimizer", _ptr),
                ("profile", _str), ("profile_network", _i32), ("epoch_time_s", _f64), ("credit_mode", _i32),
                ("initial_credits", _f64), ("chunk_bytes", _u64), ("trace", _i32), ("baseline", _i32),
                ("job_json", _str), ("partition", _i32), ("boundaries", P(_i32)), ("num_boundaries", _size),
                ("compression", _i32), ("accumulation", _i32),
                # the strategies of issue #13
                ("servers", _i32), ("staleness", _i32), ("tau", _i32), ("alpha", _f64), ("easgd_async", _i32),
                ("clients", _i32), ("dirichlet_alpha", _f64), ("client_fraction", _f64), ("local_epochs", _i32),
                ("round_deadline_s", _f64), ("average_every", _i32), ("warmup_steps", _i32)]


class _Summary(ctypes.Structure):  # tandem_sim_summary_t as of 0.5, passed with its size (tandem_sim_result_query_v)
    _fields_ = [("field_mask", _u64), ("step_time_s", _f64), ("epoch_time_s", _f64), ("total_time_s", _f64),
                ("images_per_sec", _f64), ("speedup", _f64), ("efficiency", _f64), ("compute_s", _f64),
                ("comm_exposed_s", _f64), ("bubble_s", _f64), ("throttled_s", _f64), ("idle_s", _f64),
                ("memory_per_node_bytes", _f64), ("fits", _i32), ("cost_usd", _f64), ("dp", _i32), ("pp", _i32),
                ("micro_batches", _i32), ("ranks", _i32),
                # 0.2
                ("baseline_total_time_s", _f64), ("surplus_usd", _f64), ("nodes_used", _i32), ("num_nodes", _i32),
                ("strategy", _i32), ("schedule", _i32), ("compression", _i32), ("algorithm", _i32),
                ("batch", _i64), ("global_batch", _i64), ("samples", _i64), ("steps_per_epoch", _i64),
                ("epochs", _f64), ("total_steps", _f64), ("num_stages", _i32),
                ("cluster", _str), ("model", _str), ("dataset", _str), ("allreduce", _str), ("compute_source", _str),
                ("evaluated", _i32), ("fitting", _i32), ("candidates", _i32), ("search_wall_s", _f64),
                ("bottleneck", _str), ("scaling_note", _str),
                # issue #13: STRATEGY
                ("workers", _i32), ("servers", _i32), ("window_steps", _i32), ("staleness_wait_s", _f64),
                ("busiest_nic_bytes", _f64), ("busiest_nic_rank", _i32), ("round_time_s", _f64),
                ("clients_sampled", _f64), ("clients_counted", _f64), ("clients_dropped", _f64),
                ("exchange", _str), ("busiest_nic", _str), ("note", _str),
                # issue #16: MEMORY_DETAIL
                ("memory_node", _i32), ("memory_rank", _i32), ("memory_param_bytes", _f64),
                ("memory_grad_bytes", _f64), ("memory_optimizer_bytes", _f64), ("memory_activation_bytes", _f64),
                ("memory_runtime_bytes", _f64), ("memory_buffer_bytes", _f64), ("memory_advice", _str),
                # 0.5: MEMORY_DATA
                ("memory_data_bytes", _f64)]


# The summary groups Result reads: TIMES .. LAYOUT, MEMORY_DETAIL (bit 10) and MEMORY_DATA (bit 11).
_SUMMARY_MASK = ((1 << 6) - 1) | (1 << 10) | (1 << 11)


# The header's enums by the names `tandem simulate` gives them.
_ENUMS = {
    "strategy": {"single": 0, "ddp": 1, "pipeline": 2, "hybrid": 3, "ps": 4, "ps-async": 5, "ssp": 6, "asgd": 7,
                 "easgd": 8, "fedavg": 9, "localsgd": 10},
    "schedule": {"gpipe": 0, "1f1b": 1},
    "algorithm": {"auto": 0, "ring": 1, "hd": 2, "tree": 3, "hier": 4, "det": 6},
    "credit_mode": {"preset": 0, "standard": 1, "unlimited": 2},
    "partition": {"flops": 0, "measured": 1},
    "compression": {"none": 0, "fp16": 1, "bf16": 2},
}
# keyword: (TANDEM_SIM_JOB_* bit, struct field, conversion)
_JOB_FIELDS = {
    "dataset": (1, "dataset", str), "samples": (2, "samples", int), "batch": (3, "batch", int),
    "epochs": (4, "epochs", float), "strategy": (5, "strategy", "enum"), "dp": (6, "dp", int), "pp": (7, "pp", int),
    "micro_batches": (8, "micro_batches", int), "schedule": (9, "schedule", "enum"),
    "algorithm": (10, "algorithm", "enum"), "bucket_mb": (11, "bucket_mb", float), "overlap": (12, "overlap", int),
    "profile": (14, "profile", str), "epoch_time_s": (15, "epoch_time_s", float),
    "credit_mode": (16, "credit_mode", "enum"), "initial_credits": (17, "initial_credits", float),
    "chunk_bytes": (18, "chunk_bytes", int), "trace": (19, "trace", int), "baseline": (20, "baseline", int),
    "partition": (22, "partition", "enum"), "compression": (24, "compression", "enum"),
    "accumulation": (25, "accumulation", int),
    "servers": (26, "servers", int), "staleness": (27, "staleness", int), "tau": (28, "tau", int),
    "alpha": (29, "alpha", float), "easgd_async": (30, "easgd_async", int), "clients": (31, "clients", int),
    "dirichlet_alpha": (32, "dirichlet_alpha", float), "client_fraction": (33, "client_fraction", float),
    "local_epochs": (34, "local_epochs", int), "round_deadline_s": (35, "round_deadline_s", float),
    "average_every": (36, "average_every", int), "warmup_steps": (37, "warmup_steps", int),
}
# Handled apart: the model (a tandem.train.Model, or a zoo name / spec file made into a spec-only one with
# input, classes and width_mult), the optimizer ("sgd", "momentum", "adam" or a tandem.train.Optimizer), the
# job (a dict, or a JSON file's path), profile_network and boundaries.
_MODEL_KEYS = ("model", "model_file", "input", "classes", "width_mult")
_OTHER_KEYS = _MODEL_KEYS + ("optimizer", "job", "profile_network", "boundaries")

_declared = False


def _declare():
    global _declared
    if _declared:
        return
    L = _LIB
    L.tandem_sim_cluster_create.argtypes = [_ptr, _str, P(_ptr)]
    L.tandem_sim_cluster_resize.argtypes = [_ptr, _i32, P(_ptr)]
    L.tandem_sim_cluster_info.argtypes = [_ptr, P(_i32), P(_i32)]
    L.tandem_sim_cluster_destroy.argtypes = [_ptr]
    L.tandem_sim_cluster_destroy.restype = None
    L.tandem_simulate.argtypes = [_ptr, P(_JobParams), P(_ptr)]
    L.tandem_sim_plan.argtypes = [_ptr, P(_JobParams), _i32, P(_ptr)]
    L.tandem_sim_result_query_v.argtypes = [_size, _ptr, P(_Summary)]
    L.tandem_sim_result_json.argtypes = [_ptr, ctypes.c_char_p, P(_size)]
    L.tandem_sim_result_write_trace.argtypes = [_ptr, _str]
    L.tandem_sim_dataset_info.argtypes = [_str] + [P(_i64)] * 5
    L.tandem_sim_result_destroy.argtypes = [_ptr]
    L.tandem_sim_result_destroy.restype = None
    for f in ("tandem_sim_dataset_info", "tandem_sim_cluster_create", "tandem_sim_cluster_resize", "tandem_sim_cluster_info", "tandem_simulate",
              "tandem_sim_plan", "tandem_sim_result_query_v", "tandem_sim_result_json", "tandem_sim_result_write_trace"):
        getattr(L, f).restype = ctypes.c_int32
    _declared = True


class _Ctx:
    handle = None

    @classmethod
    def get(cls):
        if cls.handle is None:
            h = _ptr()
            _check(_LIB.tandem_context_create_v(_lib.TANDEM_VERSION, None, ctypes.byref(h)))
            cls.handle = h
        return cls.handle


class Cluster:
    """A cluster to simulate: "PRESET:COUNT" ("t2.micro:4", several joined by '+'), a JSON file path, or
    JSON text. `nodes` and `devices` (ranks it can host) describe it."""

    def __init__(self, spec, _handle=None):
        _declare()
        if _handle is not None:
            self._h = _handle
        else:
            if not isinstance(spec, str):
                spec = _json.dumps(spec)  # a dict in the JSON cluster format
            h = _ptr()
            _check(_LIB.tandem_sim_cluster_create(_Ctx.get(), spec.encode(), ctypes.byref(h)))
            self._h = h
        n, d = _i32(), _i32()
        _check(_LIB.tandem_sim_cluster_info(self._h, ctypes.byref(n), ctypes.byref(d)))
        self.nodes, self.devices = n.value, d.value

    def resize(self, nodes):
        """The same kind of node as the first, `nodes` times."""
        h = _ptr()
        _check(_LIB.tandem_sim_cluster_resize(self._h, int(nodes), ctypes.byref(h)))
        return Cluster(None, _handle=h)

    def __del__(self):
        if getattr(self, "_h", None) and _LIB is not None:
            _LIB.tandem_sim_cluster_destroy(self._h)
            self._h = None


class Result:
    """A simulation (or plan search) result: r["field"] for every JSON field, attributes for the main ones."""

    _SUMMARY = ("step_time_s", "epoch_time_s", "total_time_s", "images_per_sec", "speedup", "efficiency",
                "compute_s", "comm_exposed_s", "bubble_s", "throttled_s", "idle_s", "memory_per_node_bytes",
                "fits", "cost_usd", "dp", "pp", "micro_batches", "ranks",
                # a rank's memory by kind (the largest rank on the node that fits worst); memory_data_bytes, the
                # data sets its loader holds, is the part of memory_runtime_bytes that is data
                "memory_param_bytes", "memory_grad_bytes", "memory_optimizer_bytes", "memory_activation_bytes",
                "memory_runtime_bytes", "memory_buffer_bytes", "memory_data_bytes")

    def __init__(self, handle):
        self._h = handle
        s = _Summary(field_mask=_SUMMARY_MASK)
        _check(_LIB.tandem_sim_result_query_v(ctypes.sizeof(s), self._h, ctypes.byref(s)))
        for k in self._SUMMARY:
            v = getattr(s, k)
            setattr(self, k, bool(v) if k == "fits" else v)
        n = _size(0)
        _check(_LIB.tandem_sim_result_json(self._h, None, ctypes.byref(n)))
        buf = ctypes.create_string_buffer(n.value)
        _check(_LIB.tandem_sim_result_json(self._h, buf, ctypes.byref(n)))
        self.json = _json.loads(buf.value.decode())

    def __getitem__(self, key):
        return self.json[key]

    def keys(self):
        return self.json.keys()

    def write_trace(self, path):
        """Writes the first simulated step as a Chrome trace (simulate(..., trace=True) first)."""
        _check(_LIB.tandem_sim_result_write_trace(self._h, str(path).encode()))

    def __repr__(self):
        return "Result(total_time_s=%.1f, speedup=%.2f, dp=%d, pp=%d, fits=%s)" % (
            self.total_time_s, self.speedup, self.dp, self.pp, self.fits)

    def __del__(self):
        if getattr(self, "_h", None) and _LIB is not None:
            _LIB.tandem_sim_result_destroy(self._h)
            self._h = None


def dataset_info(name):
    """The simulator's facts about a named dataset: samples, (C, H, W) and classes."""
    _declare()
    v = [_i64() for _ in range(5)]
    _check(_LIB.tandem_sim_dataset_info(str(name).encode(), *(ctypes.byref(x) for x in v)))
    return {"samples": v[0].value, "input": (v[1].value, v[2].value, v[3].value), "classes": v[4].value}


def _model(kw):
    from . import train as _train
    m = kw.get("model")
    if isinstance(m, _train.Model):
        return m
    if "model_file" in kw:
        return _train.Model(spec_path=str(kw["model_file"]), backend="none")
    shape, classes = kw.get("input"), kw.get("classes")
    if isinstance(shape, str):
        shape = [int(x) for x in shape.lower().split("x")]
    if shape is not None and len(shape) != 3:
        raise _invalid("input must be (C, H, W) or 'CxHxW', got %r" % (shape,))
    dataset = kw.get("dataset", "cifar10")
    if dataset:
        info = dataset_info(dataset)
        shape = shape if shape is not None else info["input"]
        classes = classes if classes is not None else info["classes"]
    return _train.Model(m if m is not None else "mobilenetv2", input_shape=shape, num_classes=classes,
                        width_mult=kw.get("width_mult"), backend="none")


def _optimizer(o):
    from . import train as _train
    if isinstance(o, _train.Optimizer):
        return o
    names = {"sgd": {}, "momentum": {"momentum": 0.9}, "adam": {}}
    if o not in names:
        raise _invalid("unknown optimizer %r (sgd, momentum, adam, or a tandem.train.Optimizer)" % (o,))
    return _train.Optimizer("adam" if o == "adam" else "sgd", **names[o])


def _job(kw):
    """The typed job for the keywords, and what must outlive the call (strings, arrays, handles)."""
    _declare()
    p = _JobParams()
    keep = []
    for k, v in kw.items():
        if k not in _JOB_FIELDS and k not in _OTHER_KEYS:
            raise _invalid("unknown job option %r (known: %s)" % (k, ", ".join(sorted(set(_JOB_FIELDS) |
                                                                                       set(_OTHER_KEYS)))))
        if k in _JOB_FIELDS:
            bit, field, conv = _JOB_FIELDS[k]
            p.field_mask |= 1 << bit
            if conv == "enum":
                if v not in _ENUMS[k]:
                    raise _invalid("job.%s: unknown value %r (%s)" % (k, v, ", ".join(_ENUMS[k])))
                setattr(p, field, _ENUMS[k][v])
            elif conv is str:
                b = str(v).encode()
                keep.append(b)
                setattr(p, field, b)
            else:
                _set_field(p, field, v, conv)
    if "job" in kw:
        j = kw["job"]
        if isinstance(j, dict):
            text = _json.dumps(j)
        else:
            with open(str(j)) as f:  # a job file
                text = f.read()
        b = text.encode()
        keep.append(b)
        p.field_mask |= 1 << 21
        p.job_json = b
    if any(k in kw for k in _MODEL_KEYS) or "job" not in kw:
        m = _model(kw)
        keep.append(m)
        p.field_mask |= 1 << 0
        p.model = m._h
    if "optimizer" in kw:
        o = _optimizer(kw["optimizer"])
        keep.append(o)
        p.field_mask |= 1 << 13
        p.optimizer = o._h
    if "profile_network" in kw:
        p.profile_network = int(bool(kw["profile_network"]))
    if "boundaries" in kw:
        v = kw["boundaries"]
        arr = (_i32 * len(v))(*[int(x) for x in v])
        keep.append(arr)
        p.field_mask |= 1 << 23
        p.boundaries = ctypes.cast(arr, P(_i32))
        p.num_boundaries = len(v)
    return p, keep


def _cluster(c):
    return c if isinstance(c, Cluster) else Cluster(c)


def simulate(cluster, **job):
    """Predicts a job on a cluster. Keywords as `tandem simulate` (model -- a zoo name or a tandem.train.Model --,
    model_file, dataset, batch, epochs, strategy, dp, pp, micro_batches, schedule, algorithm, bucket_mb, overlap,
    optimizer, profile, epoch_time_s, credit_mode, initial_credits, samples, input, classes, width_mult,
    chunk_bytes, trace, baseline, partition, boundaries, compression, accumulation, job -- a dict or a file; for
    strategy ps, ps-async, ssp, asgd, easgd, fedavg, localsgd: servers, staleness, tau, alpha, easgd_async, clients,
    dirichlet_alpha (not timed), client_fraction, local_epochs, round_deadline_s, average_every, warmup_steps). The
    result's JSON keys include exchange, servers, staleness_wait_s, busiest_nic and, for fedavg, rounds."""
    c = _cluster(cluster)
    p, keep = _job(job)
    h = _ptr()
    _check(_LIB.tandem_simulate(c._h, ctypes.byref(p), ctypes.byref(h)))
    del keep
    return Result(h)


def plan(cluster, top=5, **job):
    """Searches strategies (ddp, pipeline, hybrid DP x PP with micro-batches and schedules, and the parameter-server
    and averaging strategies ps, ps-async, ssp, asgd, easgd, fedavg, localsgd) and all-reduce algorithms; returns the
    `top` fastest fitting configurations as a list of dicts, fastest first. They are ranked by time per step (FedAvg:
    per round), not time to accuracy: statistical efficiency is not simulated (each dict's "note" says so)."""
    c = _cluster(cluster)
    p, keep = _job(job)
    h = _ptr()
    _check(_LIB.tandem_sim_plan(c._h, ctypes.byref(p), int(top), ctypes.byref(h)))
    del keep
    return Result(h)["candidates"]


def sweep(cluster, nodes, **job):
    """Simulates the job on 1..n copies of the cluster's first node; returns one dict per count with
    `nodes` added. strategy "ddp" uses every node as a replica, "pipeline" every node as a stage."""
    base = _cluster(cluster)
    rows = []
    strategy = job.get("strategy", "ddp")
    for n in nodes:
        c = base.resize(n)
        kw = dict(job)
        kw["strategy"] = strategy if n > 1 or strategy != "single" else "single"
        if strategy == "ddp":
            kw["dp"] = c.devices
        elif strategy == "pipeline":
            kw["pp"] = c.devices
        r = simulate(c, **kw)
        row = dict(r.json)
        row["nodes"] = n
        rows.append(row)
    return rows
