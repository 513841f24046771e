"""fairseq-train runs forked from a process that imported fairseq once: a sweep pays fairseq's
import and the plugin's registration once per worker instead of once per run (what that saves:
``scripts/bench.sh``'s fork-server line, docs/results/benchmarks).

The server (``python -m fairseq_lnpos.forkserver``) imports ``fairseq_cli.train`` and registers the
plugin as fairseq-train's ``--user-dir`` would, then reads one request per line on stdin, a JSON
object ``{"argv": [fairseq-train's arguments], "env": {...}, "log": PATH}``, and answers on stdout,
one JSON line each: ``{"ready": PID}`` once imported, ``{"started": PID}`` once it forked the run,
``{"ended": PID, "returncode": N, "peak_rss_mb": M, "cpu_seconds": C}`` once the run's process
ended (``os.wait4``; N < 0: killed by signal -N, as ``subprocess`` says it). It serves one run at a
time. The run's process is fairseq-train as it would have been started on its own:

- its own process group (killing the group stops it and its data-loader workers, not the server);
- stdout and stderr appended to ``log`` (a symbolic link there is refused), its environment
  replaced by ``env`` (the thread count taken from ``OMP_NUM_THREADS``), ``sys.argv`` fairseq-train's;
- ``fairseq_cli.train.cli_main``, the console script's entry point; an uncaught exception goes
  through ``sys.excepthook`` (the plugin's one-line errors, exit 2; else a traceback, exit 1);
  Ctrl-C and SIGTERM act as in a fresh process;
- SIGTERM when the server dies (Linux's parent-death signal), so that nothing outlives the grid.

The client, :class:`ForkServer`, gives a run as a :class:`ForkedRun`, which the grid's scheduler
watches, kills and reaps as it does a ``subprocess.Popen`` (``pid`` of its process group,
``poll()``, ``wait()``, ``returncode``, ``peak_rss_mb``, ``cpu_seconds``).

Only CPU runs are forked: CUDA must not be initialised in a process that forks, and a GPU run's
start-up is small beside its training.
"""
import atexit
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from .common import USER_DIR, open_fd
from .experiments import reap

TRAIN_SCRIPT = "fairseq-train"
PR_SET_PDEATHSIG = 1


def forkable(cmd, device):
    """Can the command ``cmd`` of a run on ``device`` (None: the CPU) be forked from the server?
    fairseq-train on the CPU only."""
    return device is None and Path(cmd[0]).name == TRAIN_SCRIPT and hasattr(os, "fork")


# ---------------------------------------------------------------- the server

def preload():
    """Import what fairseq-train imports and register the plugin as its ``--user-dir`` does,
    with the plugin's one-line errors (``fairseq_lnpos.errors.install_excepthook``)."""
    import argparse

    import fairseq_cli.train  # noqa: F401  (fairseq, torch, the root logger as fairseq-train sets it)
    from fairseq import utils

    from . import register
    from .errors import install_excepthook

    register()
    # fairseq's own bookkeeping: the run's --user-dir is then known to be imported
    utils.import_user_module(argparse.Namespace(user_dir=str(USER_DIR)))
    install_excepthook()


def _parent_death_signal(signum):
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signum)
    except (OSError, AttributeError):  # not Linux: the grid's kill_all still reaches the group
        pass


def _exit_code(code):
    """The exit status ``sys.exit(code)`` gives."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _train(argv):
    """fairseq-train's entry point on ``argv``; its exit status."""
    from fairseq_cli.train import cli_main

    from .tasks import translation_lnpos

    sys.argv = [TRAIN_SCRIPT, *argv]
    translation_lnpos.LOADED_AT = time.time()  # what this run creates is newer (see _remove_new_empty_folder)
    try:
        cli_main()
        return 0
    except SystemExit as e:
        return _exit_code(e.code)
    except BaseException:
        try:
            sys.excepthook(*sys.exc_info())  # the plugin's one line (it exits 2), or a traceback
        except SystemExit as e:
            return _exit_code(e.code)
        return 1


def _child(request, server_pid, replies_fd):
    """In the forked process: become the run (see the module's doc), never return."""
    code = 1
    try:
        os.setpgid(0, 0)
        _parent_death_signal(signal.SIGTERM)
        if os.getppid() != server_pid:  # the server died before the signal was set
            os._exit(1)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.close(replies_fd)
        null = open_fd(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        log = open_fd(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        os.environ.clear()
        os.environ.update(request["env"])
        threads = request["env"].get("OMP_NUM_THREADS")
        if threads:
            import torch

            torch.set_num_threads(int(threads))
        code = _train(request["argv"])
        atexit._run_exitfuncs()  # what the interpreter runs at exit: logging, data-loader workers
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def serve(requests, replies_fd):
    """Fork one run per request line of ``requests``; answer on ``replies_fd`` (module doc)."""
    def answer(obj):
        os.write(replies_fd, (json.dumps(obj) + "\n").encode())

    server = os.getpid()
    answer({"ready": server})
    for line in requests:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request, server, replies_fd)
        try:
            os.setpgid(pid, pid)  # also here: the group exists before the client can kill it
        except OSError:  # it made its group already, or it has ended
            pass
        answer({"started": pid})
        _, status, usage = os.wait4(pid, 0)
        answer({"ended": pid, "returncode": os.waitstatus_to_exitcode(status),
                "peak_rss_mb": usage.ru_maxrss / 1024, "cpu_seconds": usage.ru_utime + usage.ru_stime})


def main():
    replies_fd = os.dup(1)
    os.dup2(2, 1)  # what the imports print goes to stderr, not into the answers
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the grid stops the server with SIGTERM
    preload()
    serve(sys.stdin, replies_fd)


# ---------------------------------------------------------------- the client

class ServerGone(Exception):
    pass


class ForkedRun:
    """A run forked by the server, watched like a ``subprocess.Popen``: ``pid`` (its own process
    group), ``poll()``, ``wait()``, ``returncode``; once ended ``peak_rss_mb`` and ``cpu_seconds``."""

    def __init__(self, pid, args):
        self.pid, self.args = pid, args
        self.returncode = None
        self._ended = threading.Event()

    def _end(self, returncode, peak_rss_mb=None, cpu_seconds=None):
        if self.returncode is None:
            self.peak_rss_mb, self.cpu_seconds = peak_rss_mb, cpu_seconds
            self.returncode = returncode
        self._ended.set()

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode


class ForkServer:
    """A server process (``python -m fairseq_lnpos.forkserver``) started with ``popen(cmd, env,
    **kw)`` (the grid's, which tracks and kills it), its stderr to ``stderr`` (a file object)."""

    def __init__(self, popen, env, stderr):
        # the plugin the runs' --user-dir names, whatever else the path holds
        path = os.pathsep.join(p for p in (str(USER_DIR.parent), env.get("PYTHONPATH")) if p)
        self.proc = popen([sys.executable, "-m", "fairseq_lnpos.forkserver"], dict(env, PYTHONPATH=path),
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr)
        self.lock = threading.Lock()
        self.current = None
        self.started = threading.Condition(self.lock)
        self.started_pid = None
        self.gone = False
        self.ready = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        try:
            for line in self.proc.stdout:
                msg = json.loads(line)
                with self.lock:
                    if "ready" in msg:
                        self.ready.set()
                    elif "started" in msg:
                        self.started_pid = msg["started"]
                        self.started.notify_all()
                    elif "ended" in msg and self.current is not None and self.current.pid == msg["ended"]:
                        self.current._end(msg["returncode"], msg["peak_rss_mb"], msg["cpu_seconds"])
        except ValueError:  # not an answer: the server is broken
            pass
        finally:
            code = reap.wait(self.proc)  # the server's CPU time: its own and its runs' (cpu_seconds)
            with self.lock:
                self.gone = True
                self.ready.set()
                self.started.notify_all()
                if self.current is not None:  # its run died with it (parent-death signal)
                    self.current._end(code if code < 0 else -signal.SIGTERM)

    @property
    def alive(self):
        return not self.gone

    def spawn(self, argv, env, log):
        """Fork fairseq-train with ``argv`` (its arguments), ``env`` and its output appended to
        ``log``: a :class:`ForkedRun`; :class:`ServerGone` when the server has ended."""
        self.ready.wait()
        request = json.dumps({"argv": [str(a) for a in argv], "env": dict(env), "log": str(log)}) + "\n"
        with self.lock:
            if self.gone:
                raise ServerGone(f"the fork server ended (exit {self.proc.returncode})")
            self.started_pid = None
            try:
                self.proc.stdin.write(request.encode())
                self.proc.stdin.flush()
            except OSError:
                raise ServerGone("the fork server ended") from None
            while self.started_pid is None and not self.gone:
                self.started.wait()
            if self.started_pid is None:
                raise ServerGone(f"the fork server ended (exit {self.proc.returncode})")
            self.current = ForkedRun(self.started_pid, [TRAIN_SCRIPT, *argv])
            return self.current

    def close(self):
        """End the server (its stdin closed, then SIGTERM to its group if it lingers)."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        self.reader.join(5)  # it reaps the server once its answers end
        if self.reader.is_alive():
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            self.reader.join()


if __name__ == "__main__":
    main()
