"""The command line's answers to common mistakes (run by CTest with TANDEM_CLI set; standard library only): an
unknown command, option, model or preset names the closest known one; `launch -np N` (mpirun's spelling) works;
a rank command without `--` in front is told where to put it; ranks see torchrun's variables too."""
import os
import subprocess
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


if __name__ == "__main__":
    unittest.main()
