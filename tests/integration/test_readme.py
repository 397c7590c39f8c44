"""README.md's shell examples run as written (issue #15).

Every ```sh block of README.md is cut into commands (a line, with its `\\` continuations) and each runs under bash,
time-bound, with the build's `tandem` first on PATH and the Python package importable, in a scratch folder that
links the repository's top-level folders (so `bench/...` and `tools/...` resolve and outputs such as profile.json stay
out of the tree); a block's `export` lines hold for the commands below them. A command must exit 0.

Not run, and listed as such in the output:
* blocks preceded by `<!-- readme-test: skip: REASON -->` (installing packages and building: what CI itself does;
  launches that need other machines or a Slurm cluster; the install consumer, tested by install_consumer);
* commands whose program is not installed here (mpirun without openmpi-bin, python3 scripts without python3-torch),
  each named with the reason.
Run by CTest with TANDEM_CLI set; standard library only.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
README = os.path.join(REPO, "README.md")
CLI = os.path.realpath(os.environ.get("TANDEM_CLI") or shutil.which("tandem") or "tandem")
SKIP_MARK = re.compile(r"<!--\s*readme-test:\s*skip:\s*(.*?)\s*-->")
TIMEOUT_S = int(os.environ.get("TANDEM_README_TIMEOUT_S", "300"))


def sh_blocks(text):
    """(first line number, commands, skip reason or None) for each ```sh block; a skip mark applies to the block
    right below it (blank lines between allowed)."""
    out, lines, i, pending_skip = [], text.splitlines(), 0, None
    while i < len(lines):
        m = SKIP_MARK.search(lines[i])
        if m:
            pending_skip = m.group(1)
        elif lines[i].strip() == "```sh":
            start, body = i + 1, []
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            cmds, cur = [], ""
            for l in body:
                cur += l + "\n"
                if not l.rstrip().endswith("\\"):
                    if cur.strip() and not cur.strip().startswith("#"):
                        cmds.append(cur.strip())
                    cur = ""
            out.append((start + 1, cmds, pending_skip))
            pending_skip = None
        elif lines[i].strip():
            pending_skip = None
        i += 1
    return out


def missing_program(cmd, env):
    """Why `cmd` cannot run here, or None: its program (after VAR=value words) is not installed, or a Python
    script of it needs PyTorch that this Python lacks."""
    words = [w for w in cmd.split() if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", w)]
    if not words:
        return None
    prog = words[0]
    if prog in ("export", "cd"):
        return None
    if shutil.which(prog, path=env["PATH"]) is None:
        return "%s is not installed here" % prog
    if "bench/torch/" in cmd:
        py = next((w for w in words if w.endswith("python3")), sys.executable)
        if subprocess.run([py, "-c", "import torch"], capture_output=True).returncode != 0:
            return "%s has no PyTorch (python3-torch)" % py
    return None


class Readme(unittest.TestCase):
    def test_every_sh_command_runs_as_written(self):
        with open(README) as f:
            blocks = sh_blocks(f.read())
        self.assertGreater(sum(len(c) for _, c, s in blocks if s is None), 5, "no runnable README blocks found")
        scratch = tempfile.mkdtemp(prefix="tandem-readme-")
        bindir = os.path.join(scratch, ".bin")
        os.mkdir(bindir)
        os.symlink(CLI, os.path.join(bindir, "tandem"))
        for name in os.listdir(REPO):
            if not name.startswith(".") and name != "build":
                os.symlink(os.path.join(REPO, name), os.path.join(scratch, name))
        # No PYTHONPATH: a reader running these commands from a checkout has none either (with it set here, the
        # PyTorch command passed while it failed as printed, "No module named 'tandem'").
        env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""), OMP_NUM_THREADS="1",
                   TANDEM_TIMEOUT_MS="60000")
        env.pop("PYTHONPATH", None)
        failures, ran, skipped = [], 0, []
        try:
            for line, cmds, skip in blocks:
                if skip is not None:
                    skipped.append("README.md:%d block: %s" % (line, skip))
                    continue
                exports = ""  # a block's `export` lines hold for the commands after them, as in one shell
                for cmd in cmds:
                    if cmd.startswith("export "):
                        exports += cmd + "\n"
                    why = missing_program(cmd, env)
                    if why:
                        skipped.append("README.md:%d `%s`: %s" % (line, cmd.splitlines()[0][:60], why))
                        continue
                    t = time.monotonic()
                    try:
                        p = subprocess.run(["bash", "-euo", "pipefail", "-c", exports + cmd], cwd=scratch, env=env,
                                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT, timeout=TIMEOUT_S)
                        rc, out = p.returncode, p.stdout.decode(errors="replace")
                        try:
                            p.stdout.decode()
                        except UnicodeDecodeError as e:  # e.g. a string read after its owner was freed
                            rc = "0 but its output is not UTF-8 (%s)" % e if rc == 0 else rc
                    except subprocess.TimeoutExpired as e:
                        rc, out = "timeout after %d s" % TIMEOUT_S, (e.stdout or b"").decode(errors="replace")
                    ran += 1
                    print("README.md:%d (%.1f s, exit %s): %s" % (line, time.monotonic() - t, rc,
                                                                   " ".join(cmd.split())[:110]), flush=True)
                    if rc != 0:
                        failures.append("README.md:%d: `%s` -> exit %s\n%s" % (line, cmd, rc, out[-2000:]))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        for s in skipped:
            print("not run: " + s, flush=True)
        self.assertFalse(failures, "\n\n".join(failures))
        self.assertGreater(ran, 5)


if __name__ == "__main__":
    unittest.main()
