"""Run by `tandem launch -n 3 -- /usr/bin/python3 strategies_script.py OUT_DIR`: every parallel strategy of
tandem.train.Trainer as a 3-rank job (ps, ps-async, ssp: 2 workers and 1 server; the averaging strategies: 3 workers),
and DDP on ranks 0 and 1 (a communicator split off the world) as the reference of synchronous ps. Each rank writes
OUT_DIR/rank<r>.json: per job, the training-set loss before and after training, and the rank's parameters before and
after it (after: past a sync point, evaluate). The test (test_train.LaunchedStrategies) checks them."""
import json
import os
import sys

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
    with open(os.path.join(sys.argv[1], "rank%d.json" % r), "w") as f:
        json.dump(results, f)
    comm.close()
    print("DONE rank %d of %d" % (r, comm.size))


if __name__ == "__main__":
    main()
