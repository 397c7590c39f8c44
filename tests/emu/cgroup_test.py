#!/usr/bin/python3
"""tools/emu-cluster's cgroup logic on a stand-in hierarchy (TANDEM_EMU_CGROUP_ROOT, `up --cgroups-only`): the
cgroup v2 path, which this machine (v1) cannot run for real, and the v1 path beside it. Needs neither root nor a
cgroup mount: the stand-in is a plain folder laid out as the kernel lays out each version, and the test checks
the files the tool writes there.

  cgroup_test.py --tool tools/emu-cluster

v2 (DIR/cgroup.controllers exists):
  - the cluster folder goes under the hierarchy, cpu and memory are delegated to it (cgroup.subtree_control of
    the parent and of the cluster folder), each host gets cpu.max "QUOTA PERIOD" and memory.max in bytes, and no
    v1 file (cpu.cfs_quota_us, memory.limit_in_bytes) is written anywhere;
  - a period too short for the kernel's 1 ms minimum quota is lengthened (0.1 core -> "1000 10000");
  - `exec I -- CMD` writes its own PID (the command's, after exec) to host I's cgroup.procs;
  - `status --json` reads memory.max, memory.current and cpu.stat (usage_usec) of each host;
  - burstable CPU: with the host's usage in cpu.stat outrunning its credits the credit daemon lowers cpu.max
    to the baseline;
  - a parent that refuses to delegate (the no-internal-process rule) moves the cluster to the root;
  - a controller the hierarchy does not offer fails `up` naming it, and leaves nothing behind;
  - `down` removes every folder and the state.
v1 (DIR/cpu, DIR/cpuacct, DIR/memory): cpu.cfs_period_us/cpu.cfs_quota_us and memory.limit_in_bytes per host.

Exit 0 when every check passed, 1 otherwise.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time


class Checks:
    def __init__(self):
        self.failed = []

    def check(self, ok, what, detail=""):
        print(f"{'PASS' if ok else 'FAIL'}: {what}{': ' + str(detail) if detail != '' else ''}", flush=True)
        if not ok:
            self.failed.append(what)
        return ok


def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def all_files(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


class Tool:
    def __init__(self, tool, cgroot, state_root, own=None):
        self.tool = tool
        self.env = dict(os.environ, TANDEM_EMU_CGROUP_ROOT=cgroot, TANDEM_EMU_STATE_ROOT=state_root)
        self.env.pop("TANDEM_EMU_NAME", None)
        self.env.pop("TANDEM_EMU_CGROUP_SELF", None)
        if own:
            self.env["TANDEM_EMU_CGROUP_SELF"] = own  # the caller's cgroup path, as /proc/self/cgroup would say

    def run(self, args, timeout=30):
        return subprocess.run([sys.executable, self.tool] + args, env=self.env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=timeout)


def v2_root(base, controllers="cpuset cpu io memory pids"):
    """A v2 hierarchy root as the kernel shows it: the controllers it offers, nothing delegated yet."""
    os.makedirs(base)
    write(os.path.join(base, "cgroup.controllers"), controllers)
    write(os.path.join(base, "cgroup.subtree_control"), "")
    return base


def test_v2(c, tool_path, tmp):
    # The caller sits in a delegated folder (a container's cgroup) that offers cpu and memory.
    top = v2_root(os.path.join(tmp, "v2"))
    root = os.path.join(top, "job.slice")
    os.makedirs(root)
    write(os.path.join(root, "cgroup.controllers"), "cpu memory pids")
    t = Tool(tool_path, top, os.path.join(tmp, "state"), own="/job.slice")
    name = "cgtwo"
    up = t.run(["up", "--name", name, "--hosts", "2", "--cgroups-only", "--cpu-quota", "0.5", "--mem-mb", "512"])
    if not c.check(up.returncode == 0, "v2: up --cgroups-only", up.stderr.strip() or up.stdout.strip()):
        return
    try:
        state = json.load(open(os.path.join(tmp, "state", name, "state.json")))
        c.check(state["cgroup_version"] == 2, "v2: detected from cgroup.controllers", state["cgroup_version"])
        cl = os.path.join(root, "tandem-emu-" + name)
        c.check(os.path.isdir(cl), "v2: cluster folder under the caller's own cgroup", cl)
        c.check(read(os.path.join(root, "cgroup.subtree_control")) == "+cpu +memory",
                "v2: cpu and memory delegated by the parent", read(os.path.join(root, "cgroup.subtree_control")))
        c.check(read(os.path.join(top, "cgroup.subtree_control")) == "", "v2: the root left alone",
                read(os.path.join(top, "cgroup.subtree_control")))
        c.check(read(os.path.join(cl, "cgroup.subtree_control")) == "+cpu +memory",
                "v2: cpu and memory delegated by the cluster folder to the hosts",
                read(os.path.join(cl, "cgroup.subtree_control")))
        for i in range(2):
            h = os.path.join(cl, f"h{i}")
            c.check(state["hosts"][i]["cgroups"] == {"v2": h}, f"v2: host {i} recorded in one v2 folder",
                    state["hosts"][i]["cgroups"])
            c.check(read(os.path.join(h, "cpu.max")) == "2500 5000", f"v2: host {i} cpu.max = 0.5 x 5000 us period",
                    read(os.path.join(h, "cpu.max")))
            c.check(read(os.path.join(h, "memory.max")) == str(512 * 2**20), f"v2: host {i} memory.max = 512 MiB",
                    read(os.path.join(h, "memory.max")))
        # The cluster weighs the most against other work on the machine, so outsiders cannot take the quotas.
        c.check(read(os.path.join(cl, "cpu.weight")) == "10000", "v2: cluster folder cpu.weight at the maximum",
                read(os.path.join(cl, "cpu.weight")))
        v1_files = [f for f in all_files(root) if os.path.basename(f).startswith(("cpu.cfs_", "memory.limit_in"))]
        c.check(not v1_files, "v2: no v1 files written", v1_files)

        # exec: the command runs with its PID in the host's cgroup.procs (exec keeps the PID).
        ex = t.run(["exec", "--name", name, "1", "--", "sh", "-c", "echo $$ $TANDEM_EMU_HOST $TANDEM_EMU_HOSTS"])
        pid, host, hosts = (ex.stdout.split() + ["", "", ""])[:3]
        procs = read(os.path.join(cl, "h1", "cgroup.procs"))
        c.check(ex.returncode == 0 and pid != "" and procs == pid, "v2: exec writes its PID to host 1's cgroup.procs",
                f"command pid {pid}, cgroup.procs {procs}, rc {ex.returncode} {ex.stderr.strip()}")
        c.check((host, hosts) == ("1", "2"), "v2: exec exports TANDEM_EMU_HOST/HOSTS", (host, hosts))
        c.check(read(os.path.join(cl, "h0", "cgroup.procs")) is None, "v2: host 0 untouched by exec on host 1")

        # status reads the v2 files.
        write(os.path.join(cl, "h0", "memory.current"), str(300 * 2**20))
        write(os.path.join(cl, "h0", "cpu.stat"), "usage_usec 1500000\nnr_periods 40\nnr_throttled 7\n")
        stp = t.run(["status", "--name", name, "--json"])
        try:
            s = json.loads(stp.stdout)
            h0 = s["hosts"][0]
            c.check(h0["mem_limit_bytes"] == 512 * 2**20 and h0["mem_bytes"] == 300 * 2**20,
                    "v2: status reads memory.max and memory.current", (h0["mem_limit_bytes"], h0["mem_bytes"]))
            c.check(h0["cpu_seconds"] == 1.5 and h0["cpu_stat"].get("nr_throttled") == 7,
                    "v2: status reads cpu.stat (usage_usec, nr_throttled)", (h0["cpu_seconds"], h0["cpu_stat"]))
        except (ValueError, KeyError, IndexError) as e:
            c.check(False, "v2: status --json", f"{e}: {stp.stdout[:300]} {stp.stderr.strip()}")
    finally:
        down = t.run(["down", "--name", name])
    c.check(down.returncode == 0, "v2: down", down.stderr.strip() or down.stdout.strip())
    c.check(not os.path.exists(os.path.join(root, "tandem-emu-" + name)), "v2: down removes the cluster folder")
    c.check(not os.path.exists(os.path.join(tmp, "state", name)), "v2: down removes the state")
    again = t.run(["down", "--name", name])
    c.check(again.returncode == 0, "v2: down is idempotent", again.stderr.strip())


def test_v2_short_period_and_credits(c, tool_path, tmp):
    """0.1 core at a 5 ms period is below the 1 ms minimum quota: the period grows to 10 ms. With credits the
    daemon drops cpu.max to the baseline (10% of 0.5 core = 0.05 core -> 1000 of 20000) when usage outruns the
    balance, as read from cpu.stat."""
    root = v2_root(os.path.join(tmp, "v2c"))
    t = Tool(tool_path, root, os.path.join(tmp, "state"))
    name = "cgcred"
    up = t.run(["up", "--name", name, "--hosts", "2", "--cgroups-only", "--cpu-quota", "0.5", "--credits", "0.5",
                "--time-scale", "60", "--credit-tick-s", "0.05"])
    if not c.check(up.returncode == 0, "v2 credits: up --cgroups-only --credits", up.stderr.strip()):
        t.run(["down", "--name", name])
        return
    cl = os.path.join(root, "tandem-emu-" + name)
    try:
        c.check(read(os.path.join(cl, "h0", "cpu.max")) == "2500 5000", "v2 credits: full speed first",
                read(os.path.join(cl, "h0", "cpu.max")))
        # Host 0 burns 0.5 core-seconds per real second (its whole quota): 1 credit per emulated minute at 60x,
        # against 0.1 earned, so 0.5 credits last ~0.6 s. Host 1 stays idle.
        t0 = time.monotonic()
        dropped = None
        while time.monotonic() - t0 < 10:
            used_us = int((time.monotonic() - t0) * 0.5 * 1e6)
            write(os.path.join(cl, "h0", "cpu.stat.tmp"), f"usage_usec {used_us}\n")
            os.replace(os.path.join(cl, "h0", "cpu.stat.tmp"), os.path.join(cl, "h0", "cpu.stat"))
            write(os.path.join(cl, "h1", "cpu.stat"), "usage_usec 0\n")
            if read(os.path.join(cl, "h0", "cpu.max")) == "1000 20000":
                dropped = time.monotonic() - t0
                break
            time.sleep(0.02)
        c.check(dropped is not None and 0.3 <= dropped <= 5, "v2 credits: a busy host drops to its baseline "
                "(cpu.max 1000 20000) once its credits run out", f"after {dropped} s (expected ~0.6 s)")
        c.check(read(os.path.join(cl, "h1", "cpu.max")) == "2500 5000", "v2 credits: the idle host keeps full speed",
                read(os.path.join(cl, "h1", "cpu.max")))
    finally:
        down = t.run(["down", "--name", name])
    c.check(down.returncode == 0 and not os.path.exists(cl), "v2 credits: down stops the daemon and removes all",
            down.stderr.strip())

    low = t.run(["up", "--name", "cgslow", "--hosts", "1", "--cgroups-only", "--cpu-quota", "0.1"])
    c.check(low.returncode == 0 and read(os.path.join(root, "tandem-emu-cgslow", "h0", "cpu.max")) == "1000 10000",
            "v2: 0.1 core at a 5 ms period becomes 1000 of 10000 us (the 1 ms minimum quota)",
            read(os.path.join(root, "tandem-emu-cgslow", "h0", "cpu.max")))
    t.run(["down", "--name", "cgslow"])


def test_v2_refusals(c, tool_path, tmp):
    # The caller's own cgroup refuses to delegate (a folder in the way of its cgroup.subtree_control stands for
    # the kernel's EBUSY): the cluster goes to the root, which delegates.
    root = v2_root(os.path.join(tmp, "v2r"))
    od = os.path.join(root, "user.slice", "session-1.scope")
    os.makedirs(od)
    write(os.path.join(od, "cgroup.controllers"), "cpu memory")
    os.makedirs(os.path.join(od, "cgroup.subtree_control"))  # writing it fails, as EBUSY would
    t = Tool(tool_path, root, os.path.join(tmp, "state"), own="/user.slice/session-1.scope")
    up = t.run(["up", "--name", "cgrefuse", "--hosts", "1", "--cgroups-only", "--mem-mb", "256"])
    c.check(up.returncode == 0 and os.path.isdir(os.path.join(root, "tandem-emu-cgrefuse", "h0"))
            and not os.path.exists(os.path.join(od, "tandem-emu-cgrefuse"))
            and read(os.path.join(root, "cgroup.subtree_control")) == "+memory"
            and read(os.path.join(root, "tandem-emu-cgrefuse", "h0", "memory.max")) == str(256 * 2**20),
            "v2: a parent that cannot delegate (its processes) moves the cluster to the root, memory delegated there",
            up.stderr.strip())
    down = t.run(["down", "--name", "cgrefuse"])
    c.check(down.returncode == 0 and not os.path.exists(os.path.join(root, "tandem-emu-cgrefuse"))
            and os.path.isdir(od), "v2: down removes the moved cluster, not the caller's cgroup", down.stderr.strip())

    # A hierarchy without the cpu controller: a quota cannot be set; nothing is left behind.
    root2 = v2_root(os.path.join(tmp, "v2m"), controllers="io memory pids")
    t2 = Tool(tool_path, root2, os.path.join(tmp, "state"))
    up = t2.run(["up", "--name", "cgnocpu", "--hosts", "1", "--cgroups-only", "--cpu-quota", "0.5"])
    c.check(up.returncode != 0 and "cpu" in up.stderr and "not available" in up.stderr,
            "v2: a missing cpu controller fails `up` naming it", up.stderr.strip().splitlines()[-2:])
    c.check(sorted(os.listdir(root2)) == ["cgroup.controllers", "cgroup.subtree_control"]
            and not os.path.exists(os.path.join(tmp, "state", "cgnocpu")),
            "v2: the failed `up` leaves nothing behind", os.listdir(root2))


def test_v1(c, tool_path, tmp):
    root = os.path.join(tmp, "v1")
    for ctl in ("cpu", "cpuacct", "memory"):
        os.makedirs(os.path.join(root, ctl))
    t = Tool(tool_path, root, os.path.join(tmp, "state"))
    up = t.run(["up", "--name", "cgone", "--hosts", "1", "--cgroups-only", "--cpu-quota", "0.5", "--mem-mb", "256"])
    if not c.check(up.returncode == 0, "v1: up --cgroups-only", up.stderr.strip()):
        return
    try:
        h = {ctl: os.path.join(root, ctl, "tandem-emu-cgone", "h0") for ctl in ("cpu", "memory")}
        c.check((read(os.path.join(h["cpu"], "cpu.cfs_period_us")), read(os.path.join(h["cpu"], "cpu.cfs_quota_us")))
                == ("5000", "2500"), "v1: cpu.cfs_period_us 5000, cpu.cfs_quota_us 2500",
                (read(os.path.join(h["cpu"], "cpu.cfs_period_us")), read(os.path.join(h["cpu"], "cpu.cfs_quota_us"))))
        c.check(read(os.path.join(root, "cpu", "tandem-emu-cgone", "cpu.shares")) == "262144",
                "v1: cluster folder cpu.shares at the maximum", read(os.path.join(root, "cpu", "tandem-emu-cgone",
                                                                                 "cpu.shares")))
        c.check(read(os.path.join(h["memory"], "memory.limit_in_bytes")) == str(256 * 2**20),
                "v1: memory.limit_in_bytes = 256 MiB", read(os.path.join(h["memory"], "memory.limit_in_bytes")))
        c.check(not [f for f in all_files(root) if os.path.basename(f) in ("cpu.max", "memory.max")],
                "v1: no v2 files written")
    finally:
        down = t.run(["down", "--name", "cgone"])
    c.check(down.returncode == 0 and not any(os.listdir(os.path.join(root, ctl)) for ctl in ("cpu", "cpuacct",
                                                                                              "memory")),
            "v1: down removes the folders", down.stderr.strip())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tool", required=True)
    a = ap.parse_args()
    c = Checks()
    tmp = tempfile.mkdtemp(prefix="tandem_emu_cgroup_")
    try:
        test_v2(c, a.tool, tmp)
        test_v2_short_period_and_credits(c, a.tool, tmp)
        test_v2_refusals(c, a.tool, tmp)
        test_v1(c, a.tool, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{'FAILED: ' + ', '.join(c.failed) if c.failed else 'all checks passed'}", flush=True)
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
