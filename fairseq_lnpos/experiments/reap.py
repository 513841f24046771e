"""Waiting for a ``subprocess.Popen`` child with ``os.wait4``, which also gives the child's resource
usage: its peak resident set (``ru_maxrss``, kilobytes on Linux) becomes ``proc.peak_rss_mb``, its
CPU time (user + system) ``proc.cpu_seconds``: on shared cores the cost of a run, where wall time
is not.

``Popen.poll``/``wait`` reap with ``waitpid`` and drop that usage; these set ``proc.returncode``
themselves, after which Popen's own methods return it without waiting again. The peak is the
child's own process (fairseq-train; ``setpriv`` execs it in place), not its own children's (the
data loader's workers).
"""
import os


def _reaped(proc, pid, status, usage):
    if pid:
        proc.returncode = os.waitstatus_to_exitcode(status)
        proc.peak_rss_mb = usage.ru_maxrss / 1024
        proc.cpu_seconds = usage.ru_utime + usage.ru_stime
    return proc.returncode


def poll(proc):
    """``proc.poll()`` that records the peak resident set and the CPU time."""
    if proc.returncode is not None:
        return proc.returncode
    try:
        return _reaped(proc, *os.wait4(proc.pid, os.WNOHANG))
    except ChildProcessError:  # reaped elsewhere: no usage to record
        return proc.poll()


def wait(proc):
    """``proc.wait()`` that records the peak resident set and the CPU time."""
    if proc.returncode is not None:
        return proc.returncode
    try:
        return _reaped(proc, *os.wait4(proc.pid, 0))
    except ChildProcessError:
        return proc.wait()


def peak_text(proc):
    """", peak resident set N MB, C CPU s" for the scheduler's log line, or "" when it is not known."""
    peak, cpu = getattr(proc, "peak_rss_mb", None), getattr(proc, "cpu_seconds", None)
    return "" if peak is None else f", peak resident set {peak:.1f} MB, {cpu:.1f} CPU s"
