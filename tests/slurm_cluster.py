"""A one-node SLURM on this machine for tests: munged + slurmctld + slurmd, all state in a temp dir.

    python tests/slurm_cluster.py DIR      # start, print the SLURM_CONF to export, Ctrl-C stops it

:func:`start` returns a :class:`Cluster` (``env``: the environment for sbatch/squeue/scancel;
``stop()`` ends the daemons it started) or raises :class:`Unavailable` with the reason (no root,
no apt-get, the packages do not install, a daemon does not start). Every wait is bounded. The
Debian packages slurm-wlm and munge are installed (apt-get) only when slurmctld is missing and
this runs as root. No cgroups: proctrack/linuxproc, task/none; one CPU node, partition ``debug``.
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

INSTALL_TIMEOUT = 180
START_TIMEOUT = 30
PARTITION = "debug"
NODE = "lnpos0"


class Unavailable(Exception):
    """SLURM cannot be installed or started here (the message says why)."""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_installed():
    if all(Path(sbin(x)).exists() for x in ("slurmctld", "slurmd", "munged")):
        return
    if os.geteuid() != 0:
        raise Unavailable("slurmctld, slurmd or munged is missing and this is not root (apt-get install slurm-wlm munge)")
    if not shutil.which("apt-get"):
        raise Unavailable("slurmctld, slurmd or munged is missing and there is no apt-get")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    deadline = time.time() + INSTALL_TIMEOUT
    install = ["apt-get", "install", "-y", "slurm-wlm", "munge"]
    for argv in (install, ["apt-get", "update"], install):  # the package lists may be missing or stale
        try:
            r = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            raise Unavailable(f"installing slurm-wlm munge took over {INSTALL_TIMEOUT} s") from None
        if r.returncode == 0 and argv is install:
            return
    tail = r.stdout.decode(errors="replace").strip().splitlines()[-1:] or [""]
    raise Unavailable(f"apt-get install slurm-wlm munge failed: {tail[0]}")


def sbin(name):
    return shutil.which(name) or f"/usr/sbin/{name}"


CONF = """\
ClusterName=lnpos
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
PlugStackConfig={d}/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
KillWait=10
MinJobAge=3600
NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName={partition} Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


class Cluster:
    def __init__(self, d):
        self.dir = Path(d)
        self.procs = []
        self.env = dict(os.environ, SLURM_CONF=str(self.dir / "slurm.conf"))
        self.partition = PARTITION

    def _daemon(self, argv, name):
        with open(self.dir / f"{name}.out", "ab") as log:
            try:
                p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                     start_new_session=True)
            except OSError as e:
                self.stop()
                raise Unavailable(f"{name} cannot be started: {e}") from None
        self.procs.append(p)
        return p

    def start(self):
        d = self.dir
        for sub in ("state", "spool"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        (d / "plugstack.conf").write_text("")
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self._daemon([sbin("munged"), "--foreground", "--force", f"--socket={d}/munge.socket",
                      f"--key-file={key}", f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log",
                      f"--seed-file={d}/munged.seed"], "munged")
        self._wait(lambda: (d / "munge.socket").exists(), "munged")
        (d / "slurm.conf").write_text(CONF.format(
            d=d, ctld_port=free_port(), d_port=free_port(), node=NODE, host=socket.gethostname(),
            cpus=os.cpu_count() or 1, partition=PARTITION))
        self._daemon([sbin("slurmctld"), "-D", "-i", "-f", str(d / "slurm.conf")], "slurmctld")
        self._wait(lambda: self._ok(["scontrol", "ping"], "UP"), "slurmctld")
        self._daemon([sbin("slurmd"), "-D", "-N", NODE, "-f", str(d / "slurm.conf")], "slurmd")
        self._wait(lambda: self._ok(["sinfo", "-h", "-o", "%t"], "idle"), "slurmd")
        return self

    def _ok(self, argv, word):
        try:
            r = subprocess.run(argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=10)
        except subprocess.TimeoutExpired:
            return False
        return word in r.stdout.decode(errors="replace")

    def _wait(self, ready, name):
        deadline = time.time() + START_TIMEOUT
        while time.time() < deadline:
            if ready():
                return
            dead = [p for p in self.procs if p.poll() is not None]
            if dead:
                break
            time.sleep(0.5)
        out = self.dir / f"{name}.out"
        log = self.dir / f"{name}.log"
        tail = [x for f in (log, out) if f.exists() for x in f.read_text(errors="replace").splitlines()][-1:]
        self.stop()
        raise Unavailable(f"{name} did not start within {START_TIMEOUT} s: {tail[0] if tail else 'no output'}")

    def stop(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.procs = []


def start(d):
    """Install (when needed and possible) and start a one-node SLURM with its state in ``d``."""
    ensure_installed()
    if not shutil.which("sbatch"):
        raise Unavailable("sbatch is not on PATH")
    return Cluster(d).start()


if __name__ == "__main__":
    c = start(Path(sys.argv[1]).resolve())
    print(f"export SLURM_CONF={c.env['SLURM_CONF']}   # Ctrl-C stops the daemons", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        c.stop()
