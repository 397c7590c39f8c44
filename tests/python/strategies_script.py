"""Run by `tandem launch -n 3 -- /usr/bin/python3 strategies_script.py OUT_DIR`: every parallel strategy of
tandem.train.Trainer as a 3-rank job (ps, ps-async, ssp: 2 workers and 1 server; the averaging strategies: 3 workers),
and DDP on ranks 0 and 1 (a communicator split off the world) as the reference of synchronous ps. Each rank writes
OUT_DIR/rank<r>.json: per job, the training-set loss before and after training, and the rank's parameters before and
after it (after: past a sync point, evaluate); then ps and ssp (S = 2) again, stepped by hand with worker 1 kept
behind worker 0 (train_paced). The test (test_train.LaunchedStrategies) checks them."""
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bindings", "python"))
import tandem  # noqa: E402
import tandem.train as tt  # noqa: E402

EPOCHS = 2
SPEC = json.dumps({"name": "mlp16", "input": [1, 6, 6],
                   "layers": [{"type": "linear", "out_features": 16}, {"type": "relu"},
                              {"type": "linear", "out_features": 3}]})
JOBS = (("ps", {}), ("ps-async", dict(servers=1)), ("ssp", dict(staleness=1)), ("localsgd", dict(average_every=2)),
        ("easgd", dict(tau=2, alpha=0.3)), ("asgd", {}), ("fedavg", dict(clients=6, client_fraction=0.5)))


def train(strategy, comm, kw):
    data = tt.Dataset("synthetic", shape=(1, 6, 6), num_classes=3, count=96, seed=2)
    model = tt.Model(spec_json=SPEC, seed=3)
    initial = [float(v) for v in model.get_params()]
    t = tt.Trainer(model, data, None, tt.Optimizer("sgd", lr=0.1), batch_size=8, epochs=EPOCHS, seed=7,
                   strategy=strategy, comm=comm, **kw)
    before = t.evaluate(data)["loss"]
    for _ in range(EPOCHS):
        t.epoch()
    after = t.evaluate(data)["loss"]
    out = {"before": before, "after": after, "initial": initial, "params": [float(v) for v in model.get_params()]}
    t.close()
    return out


PACED_STEPS = 6  # one epoch: 96 samples / (2 workers x 8)


def train_paced(strategy, comm, staleness, marks):
    """ps (staleness 0) or ssp on 2 workers + 1 server, stepped by hand with worker 1 slow: it takes step i only once
    worker 0 completed min(i + staleness - 1, N) steps (worker 0 leaves a file in `marks` after each), as far behind
    as the bound lets it fall. ssp's fast worker then computes from parameters `staleness` clocks old, where ps's
    waits: the two must end apart."""
    data = tt.Dataset("synthetic", shape=(1, 6, 6), num_classes=3, count=96, seed=2)
    model = tt.Model(spec_json=SPEC, seed=3)
    kw = dict(servers=1) if strategy == "ps" else dict(servers=1, staleness=staleness)
    t = tt.Trainer(model, data, None, tt.Optimizer("sgd", lr=0.1), batch_size=8, epochs=1, seed=7,
                   strategy=strategy, comm=comm, **kw)
    os.makedirs(marks, exist_ok=True)
    r = comm.rank
    for i in range(1, PACED_STEPS + 1):
        if r == 1:
            want = os.path.join(marks, "done%d" % min(i + staleness - 1, PACED_STEPS))
            deadline = time.monotonic() + 60
            while i + staleness - 1 > 0 and not os.path.exists(want):
                if time.monotonic() > deadline:
                    raise RuntimeError("worker 1 waited 60 s for %s" % want)
                time.sleep(0.005)
        if t.step()["samples"] == 0 and r < 2:
            raise RuntimeError("worker %d ran out of batches at step %d" % (r, i))
        if r == 0:
            open(os.path.join(marks, "done%d" % i), "w").close()
    after = t.evaluate(data)["loss"]  # a sync point: every worker holds the servers' parameters
    out = {"after": after, "params": [float(v) for v in model.get_params()]}
    t.close()
    return out


def main():
    comm = tandem.Communicator()
    r = comm.rank
    results = {}
    pair = comm.split(0 if r < 2 else -1, r)  # ranks 0 and 1: the DDP reference; rank 2 sits it out
    if pair is not None:
        results["ddp"] = train("ddp", pair, {})
        pair.close()
    for strategy, kw in JOBS:
        results[strategy] = train(strategy, comm, kw)
    for name, strategy, staleness in (("ps-paced", "ps", 0), ("ssp-paced", "ssp", 2)):
        results[name] = train_paced(strategy, comm, staleness, os.path.join(sys.argv[1], name))
    with open(os.path.join(sys.argv[1], "rank%d.json" % r), "w") as f:
        json.dump(results, f)
    comm.close()
    print("DONE rank %d of %d" % (r, comm.size))


if __name__ == "__main__":
    main()
