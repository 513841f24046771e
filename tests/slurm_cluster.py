"""A one-node SLURM on this machine for tests: munged + slurmctld + slurmd, all state in a temp dir.

    python tests/slurm_cluster.py DIR      # start, print the SLURM_CONF to export, Ctrl-C stops it

:func:`start` returns a :class:`Cluster` (``env``: the environment for sbatch/squeue/scancel;
``stop()`` ends the daemons it started) or raises :class:`Unavailable` with the reason (a program of
the Debian packages slurm-wlm and munge is missing, a daemon does not start). Nothing is installed
here (.ci/run installs the packages where it can). Every wait is bounded. No cgroups:
proctrack/linuxproc, task/none; one CPU node, partition ``debug``.
"""
import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

START_CHECKS, CHECK_PAUSE = 60, 0.5  # a daemon is ready within 60 checks, half a second apart
PARTITION = "debug"
NODE = "lnpos0"


class Unavailable(Exception):
    """SLURM is missing here or does not start (the message says why)."""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def missing():
    """The daemons and client commands a one-node SLURM needs that this machine lacks."""
    return [x for x in ("munged", "slurmctld", "slurmd") if not Path(sbin(x)).exists()] + \
        [x for x in ("sbatch", "srun", "squeue", "scancel", "scontrol", "sinfo") if not shutil.which(x)]


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

    def _out(self, argv):
        """The output of a SLURM command, None when it fails."""
        try:
            r = subprocess.run(argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=10)
        except subprocess.TimeoutExpired:
            return None
        return r.stdout.decode(errors="replace") if r.returncode == 0 else None

    def _ok(self, argv, word):
        return word in (self._out(argv) or "")

    def _wait(self, ready, name):
        """Until ``ready()`` (checked at most START_CHECKS times) or a daemon has exited."""
        for _ in range(START_CHECKS):
            if ready():
                return
            if any(p.poll() is not None for p in self.procs):
                break
            time.sleep(CHECK_PAUSE)
        out = self.dir / f"{name}.out"
        log = self.dir / f"{name}.log"
        tail = [x for f in (log, out) if f.exists() for x in f.read_text(errors="replace").splitlines()][-1:]
        self.stop()
        raise Unavailable(f"{name} is not ready after {START_CHECKS} checks: {tail[0] if tail else 'no output'}")

    def stop(self):
        """Cancel every job and let slurmd end their steps (bounded), then end the daemons."""
        if self.procs:
            subprocess.run(["scancel", "--full", "--user", getpass.getuser()], env=self.env, capture_output=True,
                           timeout=30)
            for _ in range(START_CHECKS):
                if self._out(["squeue", "-h", "-o", "%i"]) in ("", None):  # empty, or slurmctld is gone
                    break
                time.sleep(CHECK_PAUSE)
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
    """Start a one-node SLURM with its state in ``d``."""
    lacking = missing()
    if lacking:
        raise Unavailable(f"{', '.join(lacking)} not found (the Debian packages slurm-wlm and munge; .ci/run "
                          f"installs them when it runs as root with apt-get)")
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
