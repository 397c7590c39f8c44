"""The installed tandem-runtime wheel (tests/wheel/run_wheel_test.sh installs it into a fresh virtual environment
and runs this with pytest from outside the source tree)."""
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap

import numpy as np
import pytest

import tandem
import tandem.simulate as ts

VERSION = os.environ["TANDEM_VERSION"]
SOURCE = os.environ["TANDEM_SOURCE_DIR"]


def test_the_package_is_the_installed_one_with_its_own_library():
    site = sysconfig.get_paths()["platlib"]
    assert os.path.dirname(os.path.abspath(tandem.__file__)) == os.path.join(site, "tandem")
    assert not os.path.abspath(tandem.__file__).startswith(os.path.join(os.path.abspath(SOURCE), "bindings"))
    lib = tandem.LIBRARY_PATH
    assert os.path.dirname(lib) == os.path.join(site, "tandem"), lib
    assert tandem.version() == VERSION


def test_the_command_is_on_path_and_runs():
    exe = shutil.which("tandem")
    assert exe is not None and exe.startswith(sys.prefix), exe
    out = subprocess.run([exe, "version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and VERSION in out.stdout, out.stdout + out.stderr
    summary = subprocess.run([exe, "model", "summary", "lenet5"], capture_output=True, text=True, timeout=60)
    assert summary.returncode == 0 and "61706 parameters" in summary.stdout, summary.stdout


def test_simulation_through_the_package():
    r = ts.simulate("t2.micro:4", model="lenet5", dataset="fashion-mnist", strategy="ddp", epochs=0.1)
    assert (r.dp, r.pp) == (4, 1) and r.total_time_s > 0


def test_two_ranks_allreduce_under_the_installed_launcher(tmp_path):
    script = tmp_path / "allreduce.py"
    script.write_text(textwrap.dedent("""
        import numpy as np, tandem
        comm = tandem.Communicator()
        x = np.full(1000, comm.rank + 1, dtype=np.float32)
        comm.allreduce(x)
        assert float(x[0]) == 3.0, x[0]
        print("rank", comm.rank, "ok")
        comm.close()
    """))
    p = subprocess.run([shutil.which("tandem"), "launch", "-n", "2", "--", sys.executable, str(script)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "rank 0 ok" in p.stdout and "rank 1 ok" in p.stdout
