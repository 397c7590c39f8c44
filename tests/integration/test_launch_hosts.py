"""Multi-machine launches as users run them (issue #15).

* `tandem launch --hosts A:2,B:2 --ssh-cmd 'ssh ...'`: two hosts are network namespaces made here (tools/emu-cluster,
  a bridge on a private subnet, nothing in the root namespace), each running OpenSSH's sshd on a key generated in a
  temporary folder; the launcher runs in host 0's namespace and reaches both hosts over ssh. A 4-rank DDP training
  succeeds, every rank learns its rank/world/address/port from the command line (ssh forwards no environment) and
  the job secret from stdin: it shows in no process's command line.
* The same through a wrapper that enters the namespace with `env -i` (no environment at all reaches the rank).
* A rank that would be "rank 0 of 1" while a launcher announced more fails loudly.
* `mpirun` (Open MPI) and `srun` (Slurm's variables, set by hand: there is no Slurm here) start working jobs.

Needs root, `ip netns` and sshd for the ssh tests, mpirun for the mpirun test; each missing piece SKIPs its tests
with the reason. Run by CTest with TANDEM_CLI set; standard library only.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

CLI = os.path.realpath(os.environ.get("TANDEM_CLI") or shutil.which("tandem") or "tandem")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
EMU = os.path.join(REPO, "tools", "emu-cluster")
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
DDP = ["train", "--model", "lenet5", "--dataset", "synthetic", "--strategy", "ddp", "--limit-batches", "3",
       "--eval-limit-batches", "1", "--epochs", "1", "--threads", "1", "--json"]
SSH_PORT = 2222

# What each rank runs in the probe job: reports where it is and whether the secret arrived -- and whether the secret
# can be read from any command line on this machine (all namespaces share one PID namespace here).
PROBE = r"""
import json, os
s = os.environ.get("TANDEM_SECRET", "")
seen = False
for p in os.listdir("/proc"):
    if p.isdigit():
        try:
            seen = seen or (s.encode() in open("/proc/%s/cmdline" % p, "rb").read())
        except OSError:
            pass
names = ("TANDEM_RANK", "TANDEM_WORLD_SIZE", "TANDEM_LOCAL_RANK", "TANDEM_LOCAL_WORLD_SIZE", "TANDEM_MASTER_ADDR",
         "TANDEM_MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
         "TANDEM_TIMEOUT_MS", "TANDEM_STORE", "HOME_MARK")
out = {n: os.environ.get(n) for n in names}
out.update(secret_len=len(s), secret_in_cmdline=bool(s) and seen, netns=os.readlink("/proc/self/ns/net"),
           cwd=os.getcwd())
print(json.dumps(out), flush=True)
"""


def run(cmd, timeout=180, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout, **kw)


def json_lines(text):
    return [json.loads(l) for l in text.splitlines() if l.startswith("{")]


class Hosts:
    """Two emulated hosts with an sshd each; everything is removed by name and PID in close()."""

    def __init__(self):
        self.name = "lh%d" % (os.getpid() % 100000)
        self.tmp = tempfile.mkdtemp(prefix="tandem-ssh-")
        self.sshd = []
        self.up = False

    def open(self):
        r = run([PY, EMU, "up", "--name", self.name, "--hosts", "2", "--preset", "custom"], timeout=60)
        if r.returncode != 0:
            raise unittest.SkipTest("cannot make network-namespace hosts here: " + r.stderr.strip()[-300:])
        self.up = True
        self.addr = [run([PY, EMU, "addr", "--name", self.name, str(i)]).stdout.strip() for i in range(2)]
        self.ns = ["%s-h%d" % (self.name, i) for i in range(2)]
        for key in ("hostkey", "id"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(self.tmp, key)],
                           check=True)
        shutil.copy(os.path.join(self.tmp, "id.pub"), os.path.join(self.tmp, "authorized_keys"))
        with open(os.path.join(self.tmp, "sshd_config"), "w") as f:
            f.write(f"Port {SSH_PORT}\nHostKey {self.tmp}/hostkey\nAuthorizedKeysFile {self.tmp}/authorized_keys\n"
                    "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
                    "StrictModes no\nUsePAM no\nPidFile none\n")
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege-separation directory
        for ns in self.ns:
            with open(os.path.join(self.tmp, ns + ".log"), "w") as log:
                self.sshd.append(subprocess.Popen(["ip", "netns", "exec", ns, SSHD, "-D", "-e", "-f",
                                                   os.path.join(self.tmp, "sshd_config")], stdout=log, stderr=log))
        for i, ns in enumerate(self.ns):  # wait until each sshd answers (bounded)
            for _ in range(50):
                if run(["ip", "netns", "exec", self.ns[0]] + self.ssh_cmd() + [self.addr[i], "true"],
                       timeout=20).returncode == 0:
                    break
                time.sleep(0.2)
            else:
                raise AssertionError(f"sshd on {ns} does not answer; its log: " +
                                     open(os.path.join(self.tmp, ns + ".log")).read()[-500:])

    def ssh_cmd(self):
        return ["ssh", "-i", os.path.join(self.tmp, "id"), "-p", str(SSH_PORT), "-o", "BatchMode=yes", "-o",
                "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR"]

    def close(self):
        for p in self.sshd:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if self.up:
            run([PY, EMU, "down", "--name", self.name], timeout=60)
        shutil.rmtree(self.tmp, ignore_errors=True)


def launch_in_host0(hosts, launch_args, command, env_extra=None, timeout=240):
    env = dict(os.environ, TANDEM_TIMEOUT_MS="20000", OMP_NUM_THREADS="1", HOME_MARK="from-the-launcher")
    env.pop("TANDEM_SECRET", None)
    env.update(env_extra or {})
    return run(["ip", "netns", "exec", hosts.ns[0], CLI, "launch"] + launch_args + ["--"] + command, env=env,
               timeout=timeout)


@unittest.skipUnless(os.geteuid() == 0, "needs root (network namespaces, sshd)")
@unittest.skipUnless(shutil.which("ip") and os.path.exists(SSHD) and shutil.which("ssh"),
                     "needs iproute2 and OpenSSH (server and client): apt-get install openssh-server")
class OverSsh(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.hosts = Hosts()
        try:
            cls.hosts.open()
        except BaseException:
            cls.hosts.close()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.hosts.close()

    def hosts_arg(self):
        return ["--hosts", f"{self.hosts.addr[0]}:2,{self.hosts.addr[1]}:2", "--ssh-cmd", " ".join(self.hosts.ssh_cmd())]

    def test_ranks_learn_their_place_from_the_command_line_and_the_secret_from_stdin(self):
        r = launch_in_host0(self.hosts, self.hosts_arg() + ["--json"], [PY, "-c", PROBE])
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = sorted(json_lines(r.stdout), key=lambda j: j["rank"])
        self.assertEqual([j["rank"] for j in lines], [0, 1, 2, 3], r.stdout + r.stderr)
        netns = set()
        for j in lines:
            i = j["rank"]
            self.assertEqual((j["TANDEM_RANK"], j["RANK"]), (str(i), str(i)))
            self.assertEqual((j["TANDEM_WORLD_SIZE"], j["WORLD_SIZE"]), ("4", "4"))
            self.assertEqual((j["TANDEM_LOCAL_RANK"], j["LOCAL_RANK"]), (str(i % 2), str(i % 2)))
            self.assertEqual(j["TANDEM_LOCAL_WORLD_SIZE"], "2")
            self.assertEqual((j["TANDEM_MASTER_ADDR"], j["MASTER_ADDR"]), (self.hosts.addr[0], self.hosts.addr[0]))
            self.assertEqual(j["TANDEM_MASTER_PORT"], lines[0]["TANDEM_MASTER_PORT"])
            # The launcher (on host 0) serves the job's store at the rendezvous address; remote ranks are told so.
            self.assertEqual(j["TANDEM_STORE"], "%s:%s" % (self.hosts.addr[0], j["TANDEM_MASTER_PORT"]))
            self.assertNotEqual(j["MASTER_PORT"], j["TANDEM_MASTER_PORT"])  # free for torch's own rendezvous
            self.assertEqual(j["TANDEM_TIMEOUT_MS"], "20000")  # a TANDEM_* setting of the launcher's goes along
            self.assertIsNone(j["HOME_MARK"])  # ...other variables do not (ssh forwards none)
            self.assertEqual(j["secret_len"], 64)
            self.assertFalse(j["secret_in_cmdline"], "the job secret is visible in a command line")
            self.assertEqual(j["cwd"], os.getcwd())  # the launcher's directory, where it exists
            netns.add(j["netns"])
        self.assertEqual(len(netns), 2, "ranks were not spread over the two hosts")
        self.assertEqual(len({lines[0]["TANDEM_MASTER_PORT"]}), 1)

    def test_a_ddp_job_over_two_hosts_succeeds(self):
        r = launch_in_host0(self.hosts, self.hosts_arg() + ["--json", "--transport", "tcp"], [CLI] + DDP)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual([(j["rank"], j["world"]) for j in json_lines(r.stdout)], [(0, 4)], r.stdout + r.stderr)

    def test_env_i_wrapper_proves_nothing_travels_by_environment(self):
        wrapper = os.path.join(self.hosts.tmp, "netns-ssh")
        with open(wrapper, "w") as f:  # `WRAPPER HOST SCRIPT`, like ssh: HOST is a namespace name here
            f.write('#!/bin/sh\nhost="$1"; shift\nexec ip netns exec "$host" env -i PATH=/usr/bin:/bin '
                    '/bin/sh -c "$1"\n')
        os.chmod(wrapper, 0o755)
        args = ["--hosts", f"{self.hosts.ns[0]}:1,{self.hosts.ns[1]}:1", "--ssh-cmd", wrapper,
                "--master-addr", self.hosts.addr[0], "--json"]
        r = launch_in_host0(self.hosts, args, [CLI] + DDP)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual([(j["rank"], j["world"]) for j in json_lines(r.stdout)], [(0, 2)], r.stdout + r.stderr)

    def test_a_failing_remote_rank_stops_the_job(self):
        # rank 3 fails at once; the others would sleep for minutes: the launcher must stop them (over ssh) and
        # return rank 3's status quickly.
        nap = "300.%06d" % os.getpid()  # a command line no other process on this machine has
        script = 'if [ "$TANDEM_RANK" = 3 ]; then exit 5; fi; exec sleep ' + nap
        t = time.monotonic()
        r = launch_in_host0(self.hosts, self.hosts_arg() + ["--grace-ms", "2000"], ["/bin/sh", "-c", script],
                            timeout=120)
        self.assertEqual(r.returncode, 5, r.stderr)
        self.assertLess(time.monotonic() - t, 60)
        self.assertIn("rank 3 exited with status 5", r.stderr)
        time.sleep(1)  # the remote side's lifeline fired: no `sleep` of ours is left on either host
        left = run(["pgrep", "-f", "^sleep %s$" % nap]).stdout.split()
        self.assertEqual(left, [], "remote ranks outlived the launcher")


class RankZeroOfOne(unittest.TestCase):
    def test_announced_world_without_rank_variables_fails_loudly(self):
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PMI_SIZE": "4", "PMI_RANK": "2"}  # e.g. MPICH
        r = run([CLI] + DDP, env=env, timeout=120)
        self.assertNotEqual(r.returncode, 0, r.stdout)
        self.assertIn("rank 0 of 1", r.stderr)
        self.assertIn("PMI_SIZE=4", r.stderr)


class Launchers(unittest.TestCase):
    @unittest.skipUnless(shutil.which("mpirun"), "needs Open MPI's mpirun (apt-get install openmpi-bin)")
    def test_mpirun_starts_a_ddp_job(self):
        env = dict(os.environ, TANDEM_TIMEOUT_MS="20000", OMP_NUM_THREADS="1", TANDEM_SECRET="a-secret-for-mpirun")
        for v in ("TANDEM_RANK", "TANDEM_WORLD_SIZE", "RANK", "WORLD_SIZE"):
            env.pop(v, None)
        r = run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", CLI] + DDP, env=env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual([j["world"] for j in json_lines(r.stdout)], [2], r.stdout + r.stderr)  # rank 0 reports

    def test_srun_variables_start_a_ddp_job(self):
        # What `srun -N 2 -n 2` exports to each task (no Slurm here): rank/size from SLURM_*, the meeting point from
        # MASTER_ADDR/MASTER_PORT as README's sbatch recipe sets them.
        procs = []
        for rank in range(2):
            env = dict(os.environ, TANDEM_TIMEOUT_MS="20000", OMP_NUM_THREADS="1", SLURM_PROCID=str(rank),
                       SLURM_NTASKS="2", SLURM_LOCALID="0", SLURM_NNODES="2", SLURM_JOB_ID="4242", SLURM_STEP_ID="0",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT="0", TANDEM_SECRET="a-secret-for-srun")
            for v in ("TANDEM_RANK", "TANDEM_WORLD_SIZE", "RANK", "WORLD_SIZE", "TANDEM_MASTER_PORT"):
                env.pop(v, None)
            procs.append(env)
        port = free_port()
        out = []
        ps = [subprocess.Popen([CLI] + DDP, env=dict(e, MASTER_PORT=str(port)), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True) for e in procs]
        try:
            for p in ps:
                o, e = p.communicate(timeout=180)
                out.append((p.returncode, o, e))
        finally:
            for p in ps:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        for rc, o, e in out:
            self.assertEqual(rc, 0, o + e)
        self.assertEqual([j["world"] for j in json_lines(out[0][1])], [2], out[0][1] + out[0][2])  # rank 0 reports


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    unittest.main()
