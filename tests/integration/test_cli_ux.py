"""The command line's answers to common mistakes (run by CTest with TANDEM_CLI set; standard library only): an
unknown command, option, model or preset names the closest known one; `launch -np N` (mpirun's spelling) works;
a rank command without `--` in front is told where to put it; ranks see torchrun's variables too; `launch --json`
is JSON and `--log-dir` keeps each rank's output apart; a training that would run N copies of itself, or write
where it cannot, is refused before it trains."""
import json
import os
import re
import subprocess
import tempfile
import time
import unittest

CLI = os.environ.get("TANDEM_CLI", "tandem")


def tandem(*args, timeout=60):
    p = subprocess.run([CLI] + list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout


class Mistakes(unittest.TestCase):
    def test_unknown_command_names_the_closest(self):
        rc, out = tandem("lauch", "-n", "2")
        self.assertEqual(rc, 2, out)
        self.assertIn("unknown command 'lauch' (did you mean 'launch'?)", out)
        rc, out = tandem("frobnicate")
        self.assertEqual(rc, 2, out)
        self.assertNotIn("did you mean", out)  # nothing close: the list of commands only
        self.assertIn("simulate", out)

    def test_unknown_option_names_the_closest(self):
        rc, out = tandem("train", "--bach", "3")
        self.assertEqual(rc, 2, out)
        self.assertIn("unknown option '--bach' (did you mean '--batch'?)", out)
        rc, out = tandem("simulate", "--cluster", "t2.micro:2", "--stratgy=ddp")
        self.assertEqual(rc, 2, out)
        self.assertIn("did you mean '--strategy'?", out)

    def test_a_device_that_is_not_there_is_named_before_training(self):
        rc, out = tandem("train", "--model", "lenet5", "--dataset", "synthetic", "--device", "gpu", "--epochs", "1")
        self.assertNotEqual(rc, 0, out)
        self.assertIn("--device 'gpu' is not cpu, cuda or cuda:N", out)
        rc, out = tandem("calibrate", "--model", "lenet5", "--device", "cuda:x", "--out", os.devnull)
        self.assertNotEqual(rc, 0, out)
        self.assertIn("--device 'cuda:x'", out)
        # A well-formed GPU on a host without one: a clear refusal naming CUDA, no crash, no training.
        if not os.path.exists("/dev/nvidia0"):
            rc, out = tandem("train", "--model", "lenet5", "--dataset", "synthetic", "--device", "cuda", "--epochs",
                             "1", "--limit-batches", "2")
            self.assertNotEqual(rc, 0, out)
            self.assertLess(rc, 128, out)  # exited, not killed by a signal
            self.assertIn("cuda", out.lower())
            self.assertNotIn("epoch", out)

    def test_precision_and_input_are_checked_before_training(self):
        base = ("train", "--model", "lenet5", "--dataset", "synthetic", "--epochs", "1", "--limit-batches", "2")
        for extra, says in ((("--precision", "bf16"), "--precision bf16 needs --device cuda"),
                            (("--precision", "half"), "--precision 'half' is not f32, bf16 or fp16"),
                            (("--precision", "fp16", "--loss-scale", "0"),
                             "--loss-scale '0' is not dynamic, off, or a finite scale > 0"),
                            (("--precision", "fp16", "--loss-scale", "lots"), "--loss-scale 'lots' is not dynamic"),
                            (("--precision", "fp16", "--loss-scale", "128", "--loss-scale-init", "1024"),
                             "set dynamic loss scaling, but --loss-scale is '128'"),
                            (("--precision", "fp16", "--loss-scale-backoff", "1.5"),
                             "--loss-scale-backoff 1.5 must be in (0, 1)"),
                            (("--precision", "fp16", "--loss-scale-growth", "1"), "--loss-scale-growth 1 must be > 1"),
                            (("--precision", "fp16", "--loss-scale-growth-interval", "0"),
                             "--loss-scale-growth-interval 0 must be >= 1 step"),
                            (("--precision", "fp16", "--loss-scale-init", "inf"),
                             "--loss-scale-init inf must be a finite number > 0"),
                            (("--input", "3x32"), "--input '3x32' must look like 3x32x32"),
                            (("--input", "0x32x32"), "--input '0x32x32' must look like 3x32x32")):
            rc, out = tandem(*base, *extra)
            self.assertEqual(rc, 1, out)
            self.assertIn(says, out)
            self.assertNotIn("epoch", out)
        rc, out = tandem("train", "--model", "lenet5", "--input", "1x28x28", "--epochs", "1")
        self.assertEqual(rc, 1, out)
        self.assertIn("--input sets the synthetic data set's shape", out)
        rc, out = tandem("calibrate", "--model", "lenet5", "--precision", "bf16", "--out", os.devnull)
        self.assertEqual(rc, 1, out)
        self.assertIn("--precision bf16 needs --device cuda", out)
        # calibrate would time the emulation, not a GPU
        rc, out = tandem("calibrate", "--model", "lenet5", "--precision", "fp16", "--out", os.devnull)
        self.assertEqual(rc, 1, out)
        self.assertIn("--precision fp16 needs --device cuda here", out)
        # fp16 on a CPU: the emulation trains, with dynamic loss scaling by default (scale and skips reported)
        rc, out = tandem(*base, "--precision", "fp16", "--batch", "8", "--train-limit", "32", "--test-limit", "8",
                         "--json")
        self.assertEqual(rc, 0, out)
        epoch = json.loads(out.strip().splitlines()[-1])
        self.assertIn(epoch["loss_scale"], (65536.0, 32768.0, 16384.0), out)
        self.assertGreaterEqual(epoch["skipped_steps"], 0)
        # --input shapes the synthetic samples, and the model follows them
        rc, out = tandem(*base, "--input", "3x20x24", "--batch", "8", "--train-limit", "16", "--test-limit", "8")
        self.assertEqual(rc, 0, out)
        self.assertIn("samples of 3x20x24", out)

    def test_a_nested_command_checks_its_own_options(self):
        # `bench allreduce`'s options belong to allreduce, not to bench (they were refused as unknown)
        rc, out = tandem("bench", "allreduce", "-n", "2", "--sizes", "4K", "--iters", "1", "--transport", "tcp", timeout=120)
        self.assertEqual(rc, 0, out)
        self.assertNotIn("unknown option", out)
        rc, out = tandem("bench", "allreduce", "--sizs", "4K")
        self.assertEqual(rc, 2, out)
        self.assertIn("tandem bench allreduce: unknown option '--sizs' (did you mean '--sizes'?)", out)

    def test_sweep_notes_are_printed_intact(self):
        # the notes of a --nodes sweep were read after their results were freed (garbage bytes)
        p = subprocess.run([CLI, "simulate", "--cluster", "t2.micro:4", "--model", "mobilenetv2", "--dataset",
                            "cifar10", "--batch", "64", "--epochs", "10", "--strategy", "hybrid", "--dp", "2", "--pp", "2",
                            "--microbatches", "4", "--nodes", "1,2,4,8"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
        self.assertEqual(p.returncode, 0, p.stdout)
        out = p.stdout.decode()  # raises on bytes that are not UTF-8
        notes = [l for l in out.splitlines() if l.startswith("  ") and " nodes: " in l]
        self.assertTrue(notes, out)
        for l in notes:  # the bottleneck of each point too (copied out of its result as the notes are)
            self.assertTrue("super-linear" in l or l == "  1 nodes: not simulated (1 device(s) do not split into "
                            "--pp 2 stages)" or re.fullmatch(r"  [248] nodes: bottleneck [a-z ()]+ \(\d+% of the run\)",
                                                             l), l)
        self.assertEqual(3, sum(" nodes: bottleneck " in l for l in notes), out)

    def test_the_printed_command_runs_as_printed(self):
        # `run it` named a data set `tandem train` cannot load without a directory (cifar10, simulate's default):
        # the command failed as printed. It is now synthetic data of the same sample shape, with a note on the real one.
        for dataset, shape in (("cifar10", "3x32x32"), ("imagenet", "3x224x224"), ("fashion-mnist", None)):
            rc, out = tandem("simulate", "--cluster", "t2.micro:2", "--model", "lenet5", "--dataset", dataset,
                             "--strategy", "single", "--batch", "16")
            self.assertEqual(rc, 0, out)
            run = [l for l in out.splitlines() if l.startswith("  run it ")]
            self.assertEqual(len(run), 1, out)
            args = run[0].split()[2:]
            self.assertEqual(args[:2], ["tandem", "train"], run[0])
            if shape is None:
                self.assertIn("--dataset fashion-mnist", run[0])
                continue  # Fashion-MNIST's files may be absent where the tests run; its loading is tested elsewhere
            self.assertIn("--dataset synthetic --input " + shape, run[0])
            self.assertIn(dataset if dataset != "cifar10" else "--data-dir", out)
            if dataset == "imagenet":
                continue  # lenet5 at 224x224: the shape is what is checked, not a training run
            rc, trained = tandem(*args[1:], "--epochs", "1", "--limit-batches", "2", timeout=120)
            self.assertEqual(rc, 0, run[0] + "\n" + trained)
            self.assertIn("epoch 1:", trained)

    def test_the_printed_command_of_a_flag_runs_as_printed(self):
        # `run it` printed "--easgd-async true" and "--elastic true": train takes no value after a flag and refused the
        # command as printed ("The following argument was not expected: true").
        rc, out = tandem("simulate", "--cluster", "t2.micro:3", "--model", "mlp", "--dataset", "cifar10", "--batch",
                         "16", "--strategy", "easgd", "--easgd-async", "--servers", "1", "--tau", "2")
        self.assertEqual(rc, 0, out)
        run = [l for l in out.splitlines() if l.startswith("  run it ")]
        self.assertEqual(len(run), 1, out)
        self.assertRegex(run[0], r" --easgd-async( |$)")
        self.assertNotIn("true", run[0])
        args = run[0].split()[2:]
        self.assertEqual(args[:5], ["tandem", "launch", "-n", "3", "--"], run[0])
        env = dict(os.environ, TANDEM_TIMEOUT_MS="20000", OMP_NUM_THREADS="1")
        p = subprocess.run([CLI] + args[1:5] + [CLI] + args[6:] + ["--epochs", "1", "--limit-batches", "2",
                                                                   "--train-limit", "256", "--test-limit", "64",
                                                                   "--threads", "1"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120, env=env)
        self.assertEqual(p.returncode, 0, run[0] + "\n" + p.stdout)
        self.assertIn("easgd world 3", p.stdout)

    def test_the_printed_command_trains_on_the_simulated_samples(self):
        # `simulate --samples N` printed a `run it` command without --train-limit N: it trained on the whole set
        rc, out = tandem("simulate", "--cluster", "t2.micro:2", "--model", "lenet5", "--dataset", "cifar10",
                         "--strategy", "single", "--batch", "16", "--samples", "96")
        self.assertEqual(rc, 0, out)
        run = [l for l in out.splitlines() if l.startswith("  run it ")]
        self.assertEqual(len(run), 1, out)
        self.assertRegex(run[0], r" --train-limit 96( |$)")
        args = run[0].split()[2:]
        rc, trained = tandem(*args[1:], "--epochs", "1", "--test-limit", "16", timeout=120)
        self.assertEqual(rc, 0, run[0] + "\n" + trained)
        self.assertIn("epoch 1:", trained)

    def test_simulate_takes_the_runs_limit_batches(self):
        # `tandem simulate --limit-batches N` is the training run's option: a fedavg client's local epoch (the
        # round) and a ddp epoch stop after N batches; the step is unchanged
        def sim(strategy, *extra):
            rc, out = tandem("simulate", "--cluster", "t2.micro:4", "--model", "lenet5", "--dataset", "fashion-mnist",
                             "--batch", "32", "--strategy", strategy, "--json", *extra)
            self.assertEqual(rc, 0, out)
            return json.loads(out)
        full, cut = sim("fedavg"), sim("fedavg", "--limit-batches", "50")
        self.assertLess(cut["step_time_s"], 0.2 * full["step_time_s"])
        full, cut = sim("ddp"), sim("ddp", "--limit-batches", "50")
        self.assertEqual((full["steps_per_epoch"], cut["steps_per_epoch"]), (469, 50))
        self.assertEqual(full["step_time_s"], cut["step_time_s"])
        rc, out = tandem("simulate", "--cluster", "t2.micro:4", "--model", "lenet5", "--limit-batches", "-1")
        self.assertNotEqual(rc, 0)
        self.assertIn("--limit-batches", out)

    def test_simulate_pytorch_ddp_without_its_buffer_broadcast(self):
        # --framework pytorch-ddp broadcasts BatchNorm buffers before every forward (DDP's default);
        # --no-broadcast-buffers is a job with broadcast_buffers=False: a shorter step for mobilenetv2
        def sim(*extra):
            rc, out = tandem("simulate", "--cluster", "t2.micro:4", "--model", "mobilenetv2", "--dataset",
                             "fashion-mnist", "--batch", "32", "--strategy", "ddp", "--framework", "pytorch-ddp",
                             "--json", *extra)
            self.assertEqual(rc, 0, out)
            return json.loads(out)["step_time_s"]
        self.assertLess(sim("--no-broadcast-buffers"), sim())

    def test_simulate_bucket_policy_flags(self):
        # --first-bucket-mb and --bucket-sizes-mb set the bucket policy on its own (issue #16): Tandem's job with a
        # 1 MiB first bucket is timed as pytorch-ddp's buckets (buffers not broadcast, so nothing else differs);
        # both flags together are refused before anything runs
        def sim(*extra):
            rc, out = tandem("simulate", "--cluster", "t2.micro:4", "--model", "mobilenetv2", "--dataset",
                             "fashion-mnist", "--batch", "32", "--strategy", "ddp", "--json", *extra)
            self.assertEqual(rc, 0, out)
            return json.loads(out)["step_time_s"]
        torch = sim("--framework", "pytorch-ddp", "--no-broadcast-buffers")
        self.assertEqual(sim("--framework", "pytorch-ddp", "--no-broadcast-buffers", "--first-bucket-mb", "0"),
                         sim())
        self.assertNotEqual(torch, sim())
        self.assertEqual(sim("--first-bucket-mb", "1"), torch)
        self.assertEqual(sim("--bucket-sizes-mb", "1"), torch)
        self.assertNotEqual(sim("--bucket-sizes-mb", "0.05,0.05,0.05"), sim())
        rc, out = tandem("simulate", "--cluster", "t2.micro:4", "--model", "lenet5", "--strategy", "ddp",
                         "--first-bucket-mb", "1", "--bucket-sizes-mb", "1,2")
        self.assertNotEqual(rc, 0)
        self.assertIn("--bucket-sizes-mb", out)

    def test_predicted_memory_with_a_profile_counts_the_data_sets(self):
        # The prediction adds the train and test sets the trainer holds (Fashion-MNIST: ~53 MiB of 8-bit pixels) to
        # the profile's runtime_rss_bytes, measured once calibrate's passes at the job's batch ran the model's
        # kernels (issue #16). Here: -1% (84.7 MiB measured, 84.0 predicted; before: 23 MiB predicted against 91
        # MiB, then 75 against 91). With --train-limit 1000 the reader keeps 1,000 samples (it read all 60,000 and
        # copied the head: 91 MiB measured against 31 predicted): 39.6 against 39.7.
        with tempfile.TemporaryDirectory() as d:
            prof = os.path.join(d, "p.json")
            rc, out = tandem("calibrate", "--model", "lenet5", "--out", prof, timeout=120)
            self.assertEqual(rc, 0, out)
            with open(prof) as f:  # what a whole step adds at its peak, measured (the simulator's activations)
                self.assertGreater(json.load(f).get("activation_peak_bytes", 0), 1 << 20)
            for limit in ([], ["--train-limit", "1000"]):
                rc, out = tandem("train", "--model", "lenet5", "--dataset", "fashion-mnist", "--limit-batches", "5",
                                 "--eval-limit-batches", "1", *limit, "--predict", "--profile", prof, "--json",
                                 timeout=120)
                self.assertEqual(rc, 0, out)
                pred = [json.loads(l)["prediction"] for l in out.splitlines() if l.startswith('{"prediction"')]
                self.assertEqual(len(pred), 1, out)
                measured, predicted = pred[0]["measured_memory_bytes"], pred[0]["predicted_memory_bytes"]
                self.assertLess(abs(predicted - measured), 0.10 * measured, (limit, measured, predicted, out))

    def test_unknown_model_and_preset_name_the_closest(self):
        rc, out = tandem("simulate", "--cluster", "t2.mikro:2")
        self.assertNotEqual(rc, 0)
        self.assertIn("did you mean 't2.micro'?", out)
        rc, out = tandem("simulate", "--cluster", "t2.micro:2", "--model", "lenet")
        self.assertNotEqual(rc, 0)
        self.assertIn("did you mean 'lenet5'?", out)

    def test_launch_takes_mpiruns_np_and_exports_torchrun_variables(self):
        rc, out = tandem("launch", "-np", "2", "--", "sh", "-c",
                         'echo "vars $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT"')
        self.assertEqual(rc, 0, out)
        lines = sorted(l for l in out.splitlines() if "vars" in l)
        self.assertEqual(len(lines), 2, out)
        for rank, line in enumerate(lines):
            words = line.split("vars ", 1)[1].split()
            self.assertEqual(words[:5], [str(rank), str(rank), "2", "2", "127.0.0.1"], line)
            self.assertTrue(words[5].isdigit(), line)

    def test_launch_without_dashes_says_where_they_go(self):
        rc, out = tandem("launch", "-n", "2", "tandem", "train", "--strategy", "ddp")
        self.assertEqual(rc, 2, out)
        self.assertIn("put `--` before the rank's command", out)


    def test_launch_json_is_one_object_per_line_with_its_rank(self):
        p = subprocess.run([CLI, "launch", "-n", "2", "--json", "--", "sh", "-c",
                            'echo "{\\"loss\\": 0.5}"; echo not json; echo "{}"'],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        objects = [json.loads(l) for l in p.stdout.splitlines()]
        self.assertEqual(len(objects), 4, p.stdout)
        self.assertEqual(sorted((o["rank"], o.get("loss", -1)) for o in objects), [(0, -1), (0, 0.5), (1, -1), (1, 0.5)])
        self.assertIn("[rank 0] not json", p.stderr)

    def test_launch_log_dir_keeps_each_ranks_output(self):
        with tempfile.TemporaryDirectory() as d:
            rc, out = tandem("launch", "-n", "2", "--log-dir", d, "--", "sh", "-c", 'echo out $RANK; echo err $RANK >&2')
            self.assertEqual(rc, 0, out)
            for r in (0, 1):
                with open(os.path.join(d, "rank-%d.out" % r)) as f:
                    self.assertEqual(f.read(), "out %d\n" % r)
                with open(os.path.join(d, "rank-%d.err" % r)) as f:
                    self.assertEqual(f.read(), "err %d\n" % r)
        rc, out = tandem("launch", "-n", "2", "--log-dir", "/nonexistent/logs", "--", "true")
        self.assertEqual(rc, 2)
        self.assertIn("--log-dir /nonexistent/logs", out)
        with tempfile.NamedTemporaryFile() as f:  # a file: its ranks' output was lost, exit 0
            rc, out = tandem("launch", "-n", "2", "--log-dir", f.name, "--", "true")
            self.assertEqual(rc, 2, out)
            self.assertIn("--log-dir %s: not a directory" % f.name, out)

    def test_training_copies_of_itself_under_a_launcher_is_refused(self):
        t0 = time.monotonic()
        rc, out = tandem("launch", "-n", "2", "--", CLI, "train", "--model", "lenet5", "--dataset", "synthetic",
                         "--epochs", "1", "--limit-batches", "2")
        self.assertNotEqual(rc, 0, out)
        self.assertIn("with --strategy single", out)
        self.assertLess(time.monotonic() - t0, 30)

    def test_an_output_path_that_cannot_be_written_is_refused_before_training(self):
        for opt in ("--checkpoint", "--trace"):
            extra = ["--strategy", "single"] if opt == "--trace" else []
            rc, out = tandem("train", "--model", "lenet5", "--dataset", "synthetic", "--epochs", "1",
                             "--limit-batches", "2", opt, "/nonexistent/dir/file", *extra)
            self.assertEqual(rc, 2, out)
            self.assertIn("%s /nonexistent/dir/file: cannot write there" % opt, out)
            self.assertIn("nothing was trained", out)

    def test_bad_numbers_and_paths_are_named_before_any_work(self):
        # A non-positive --batch was "Value 0 not in range 0.000000 to 1797...(309 digits)"; a negative --threads
        # ran; a directory as --checkpoint failed only after the training, as --resume with "internal error:
        # basic_filebuf::underflow"; a --job file that is not JSON or a directory was a parse error naming no file.
        for args, want in ((["train", "--batch", "0"], "--batch: must be > 0, got 0"),
                           (["train", "--batch", "-4"], "--batch: must be > 0, got -4"),
                           (["train", "--threads", "-3"], "--threads: must be >= 0, got -3"),
                           # CLI11 wrapped -1 into the unsigned seed, and the run went on with 2^64-1
                           (["train", "--seed", "-1"], "--seed: must be >= 0, got -1"),
                           (["simulate", "--cluster", "t2.micro:2", "--seed", "-1"], "--seed: must be >= 0, got -1"),
                           (["launch", "-n", "2", "--", CLI, "train", "--batch", "0"],
                            "--batch: must be > 0, got 0"),
                           # these were silently replaced by the defaults (width 1.0, 1000 classes)
                           (["model", "summary", "mobilenetv2", "--width-mult", "-1"], "--width-mult: must be > 0"),
                           (["model", "summary", "resnet50", "--classes", "0"], "--classes: must be > 0, got 0"),
                           (["train", "--width-mult", "nan"], "--width-mult: must be > 0, got nan"),
                           # ignored without a word: lenet5 has no width multiplier
                           (["train", "--model", "lenet5", "--width-mult", "0.5"],
                            "--width-mult applies to mobilenetv2 and mobilenetv2_imagenet only (the model is lenet5)"),
                           (["simulate", "--cluster", "t2.micro:2", "--model", "resnet18", "--width-mult", "0.5"],
                            "--width-mult applies to mobilenetv2 and mobilenetv2_imagenet only"),
                           # read as 0 (all samples)
                           (["train", "--test-limit", "-5"], "--test-limit: must be >= 0, got -5"),
                           (["demo", "--microbatches", "0"], "--microbatches: must be > 0, got 0")):
            rc, out = tandem(*args)
            self.assertNotEqual(rc, 0, out)
            self.assertIn(want, out)
            self.assertNotIn("1797693", out)
        with tempfile.TemporaryDirectory() as d:
            t0 = time.monotonic()
            for opt, what in (("--checkpoint", "is a directory, not a file"),
                              ("--resume", "is a directory, not a checkpoint file")):
                rc, out = tandem("train", "--model", "lenet5", "--dataset", "synthetic", "--epochs", "1",
                                 "--limit-batches", "2", opt, d)
                self.assertEqual(rc, 2, out)
                self.assertIn("%s %s: %s; nothing was trained" % (opt, d, what), out)
            self.assertLess(time.monotonic() - t0, 30)
            self.assertEqual(os.listdir(d), [])  # no half file left behind
            bad = os.path.join(d, "job.json")
            with open(bad, "w") as f:
                f.write('{"batch": ')
            for job, want in ((d, "--job '%s' is a directory" % d), (bad, "--job file '%s' is not valid JSON" % bad)):
                rc, out = tandem("simulate", "--cluster", "t2.micro:2", "--model", "lenet5", "--job", job)
                self.assertEqual(rc, 1, out)
                self.assertIn(want, out)
            # calibrate measured for seconds, then could not write its --out
            t0 = time.monotonic()
            rc, out = tandem("calibrate", "--model", "lenet5", "--out", d)
            self.assertEqual(rc, 2, out)
            self.assertIn("--out %s: is a directory, not a file; nothing was measured" % d, out)
            self.assertLess(time.monotonic() - t0, 5)
            # demo calibrated for ~10 s, then its one-rank run failed on the data
            t0 = time.monotonic()
            rc, out = tandem("demo", "--data-dir", os.path.join(d, "none"), "--batches", "2")
            self.assertEqual(rc, 1, out)
            self.assertIn("demo: cannot load Fashion-MNIST; nothing was run", out)
            self.assertLess(time.monotonic() - t0, 5)
        # a size past the host's memory: "tandem: std::bad_alloc" (or the OOM killer, overcommitted)
        rc, out = tandem("bench", "allreduce", "-n", "2", "--sizes", "4K,512G")
        self.assertEqual(rc, 2, out)
        self.assertIn("--sizes: 549755813888 bytes need 2048.0 GiB on this host", out)
        self.assertNotIn("bad_alloc", out)

    def test_a_sweep_says_which_node_counts_it_could_not_simulate(self):
        # hybrid --pp 2 dropped 1 and 3 nodes silently: --nodes 1,3 printed an empty table (and plot), exit 0
        base = ["simulate", "--cluster", "t2.micro:4", "--model", "lenet5", "--strategy", "hybrid", "--pp", "2"]
        rc, out = tandem(*base, "--nodes", "1,2")
        self.assertEqual(rc, 0, out)
        self.assertIn("1 nodes: not simulated (1 device(s) do not split into --pp 2 stages)", out)
        with tempfile.TemporaryDirectory() as d:
            plot = os.path.join(d, "s.svg")
            rc, out = tandem(*base, "--nodes", "1,3", "--plot", plot)
            self.assertEqual(rc, 1, out)
            self.assertIn("3 nodes: not simulated", out)
            self.assertIn("--nodes 1,3: no node count can host this job", out)
            self.assertFalse(os.path.exists(plot))

    def test_a_diverged_run_stops_before_overwriting_its_checkpoint(self):
        # lr 1e9: "train loss -nan", the checkpoint overwritten with NaN weights, exit 0
        with tempfile.TemporaryDirectory() as d:
            ckpt = os.path.join(d, "run.ckpt")
            rc, out = tandem("train", "--model", "lenet5", "--dataset", "synthetic", "--optimizer", "adamw", "--lr",
                             "1e9", "--epochs", "1", "--limit-batches", "3", "--test-limit", "10", "--checkpoint", ckpt)
            self.assertEqual(rc, 1, out)
            self.assertIn("epoch 1: the training loss is not finite", out)
            self.assertIn("(--checkpoint %s was not overwritten)" % ckpt, out)
            self.assertFalse(os.path.exists(ckpt))

    def test_a_job_file_takes_the_flags_names(self):
        # the --job keys differed from the flags ("unknown field \"microbatches\""): a file written with the
        # flags' names now describes the same job as the flags
        flags = ["--strategy", "hybrid", "--dp", "2", "--pp", "2", "--batch", "32", "--microbatches", "4",
                 "--bucket-mb", "5", "--no-overlap", "--cut", "0,3,12", "--algo", "ring", "--accumulate", "2"]
        job = {"strategy": "hybrid", "dp": 2, "pp": 2, "batch": 32, "microbatches": 4, "bucket-mb": 5,
               "no-overlap": True, "cut": "0,3,12", "algo": "ring", "accumulate": 2}
        base = ["simulate", "--cluster", "t2.micro:4", "--model", "lenet5", "--json"]
        rc, by_flags = tandem(*base, *flags)
        self.assertEqual(rc, 0, by_flags)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "job.json")
            with open(path, "w") as f:
                json.dump(job, f)
            rc, by_file = tandem(*base, "--job", path)
            self.assertEqual(rc, 0, by_file)
            a, b = json.loads(by_file), json.loads(by_flags)
            a.pop("sim_wall_s"), b.pop("sim_wall_s")  # the simulator's own run time
            self.assertEqual(a, b)
            with open(path, "w") as f:
                f.write('{"microbatches": 4, "micro_batches": 2}')
            rc, out = tandem(*base, "--job", path)
            self.assertEqual(rc, 1, out)
            self.assertIn('"microbatches" gives micro_batches a second time', out)

    def test_launch_env_before_the_dashes_sets_the_local_ranks_variable(self):
        # `--env A=1 -- sh -c ...` took `sh` as a second --env value ("argument was not expected: -c"), and local
        # ranks never saw A=1 (only remote ones did)
        rc, out = tandem("launch", "-n", "2", "--env", "TANDEM_TEST_A=1", "--env", "TANDEM_TEST_B=x y", "--", "sh",
                         "-c", 'echo "A=$TANDEM_TEST_A B=$TANDEM_TEST_B"')
        self.assertEqual(rc, 0, out)
        for r in (0, 1):
            self.assertIn("[rank %d] A=1 B=x y" % r, out)
        rc, out = tandem("launch", "-n", "2", "--env", "=x", "--", "true")
        self.assertNotEqual(rc, 0, out)
        self.assertIn("expected NAME or NAME=VALUE, got '=x'", out)

    def test_a_job_that_does_not_fit_is_not_offered_as_a_command(self):
        # simulate printed "DOES NOT FIT" and then "run it  tandem train ..."; plan did the same for its best of
        # configurations that all run out of memory
        job = ["--cluster", "t2.micro:2", "--model", "vgg16_imagenet", "--dataset", "imagenet", "--batch", "256"]
        rc, out = tandem("simulate", *job)
        self.assertEqual(rc, 0, out)
        self.assertIn("DOES NOT FIT", out)
        self.assertIn("run it         nothing to run: the job does not fit", out)
        self.assertNotIn("tandem train", out)
        rc, out = tandem("plan", *job)
        self.assertEqual(rc, 0, out)
        self.assertIn("run the best: nothing to run: no configuration fits in memory", out)
        self.assertNotIn("tandem launch", out)


if __name__ == "__main__":
    unittest.main()
