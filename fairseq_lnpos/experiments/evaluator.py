"""The grid's evaluator: one long-lived process that scores checkpoints as training saves them.

A new ``fairseq-generate`` per epoch spends most of its time importing fairseq and loading; this
process imports fairseq once and then, for each request, runs fairseq-generate's own ``main()``
(evaluate.run_generate: fairseq's SequenceGenerator, the same batches and options as the command)
and scores the hypotheses (evaluate.score_hyps). The grid starts one per device (one on a CPU)
and talks to it through JSON lines: a request on stdin (records.ScoreRequest), the result on stdout
(records.Scores); fairseq's logging goes to stderr (the grid's ``evaluator.log``).

:class:`Evaluator` is the grid's side: a queue served by one thread per process (``--evaluators N``
processes per device, default 1), so training never waits for scoring; a callback receives each
result. A process that dies while scoring (killed, e.g. by the out-of-memory killer) is not the grid
stopping: a new process scores that checkpoint again, and a second death is that request's failure.
On a GPU the process gives the memory PyTorch's allocator keeps back to the driver after each
checkpoint (:func:`release_cuda_cache`): between two epochs it holds none that the runs training
beside it could use.
"""
import gc
import json
import logging
import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import replace

from ..common import open_log
from ..errors import LnposError
from .evaluate import LOG_FORMAT, generate_and_score
from .records import ScoreRequest


LOG = logging.getLogger("fairseq_lnpos.evaluator")


class Stopped(Exception):
    """The grid is stopping: a request was not answered."""


class EvalFailed(Exception):
    """The evaluator could not score a checkpoint (the message says why)."""


class Evaluator:
    attempts = 2  # processes that may die on one request before it fails

    def __init__(self, env, log_path, launch, processes=1, stopping=lambda: False):
        """``launch(cmd, env, **popen_kwargs)`` starts a process (the grid's, so that it can stop it);
        ``processes`` of them take the requests from one queue; ``stopping()`` tells whether the
        grid is stopping (then a process that dies is no failure)."""
        self.env, self.log_path, self.launch, self.stopping = env, log_path, launch, stopping
        self.requests = queue.Queue()
        self.procs = [None] * processes
        self.busy = 0
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._serve, args=(i,), daemon=True) for i in range(processes)]
        for t in self.threads:
            t.start()

    def submit(self, request, callback):
        """Score ``request`` (:class:`~.records.ScoreRequest`) when its turn comes; then
        ``callback(result, None)`` (the answer's JSON object, :class:`~.records.Scores` of it) or
        ``callback(None, exception)``."""
        with self.lock:
            self.busy += 1
        self.requests.put((request, callback))

    @property
    def pending(self):
        with self.lock:
            return self.busy

    def stop(self):
        """Let the threads end after their current request (the grid is stopping)."""
        for _ in self.threads:
            self.requests.put(None)

    def close(self):
        self.stop()
        for t in self.threads:
            t.join()
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.stdin.close()
                proc.wait()

    def _serve(self, i):
        while True:
            item = self.requests.get()
            if item is None:
                return
            request, callback = item
            try:
                result, error = self._ask(i, request), None
            except Exception as e:  # every error is that request's, never the end of this thread
                result, error = None, e
            with self.lock:
                self.busy -= 1
            callback(result, error)

    def _ask(self, i, request):
        for _ in range(self.attempts):
            proc = self.procs[i]
            if proc is None or proc.poll() is not None:
                log = open_log(self.log_path, binary=True)
                proc = self.procs[i] = self.launch([sys.executable, "-m", "fairseq_lnpos.experiments.evaluator"],
                                                   self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
                log.close()
            try:
                proc.stdin.write((json.dumps(request.to_json()) + "\n").encode())
                proc.stdin.flush()
                line = proc.stdout.readline()
            except (BrokenPipeError, OSError):
                line = b""
            if line:
                break
            code = proc.wait()
            if self.stopping():
                raise Stopped()
            if code >= 0:  # it exited by itself: scoring again would fail the same way
                raise EvalFailed(f"the evaluator exited ({code}) while scoring {request.checkpoint}; "
                                 f"see {self.log_path}")
        else:
            raise EvalFailed(f"the evaluator was killed (signal {-code}) while scoring {request.checkpoint}, "
                             f"{self.attempts} times (out of memory?); see {self.log_path}")
        answer = json.loads(line)
        if "error" in answer:
            raise EvalFailed(answer["error"])
        return answer["result"]


def release_cuda_cache():
    """Return the CUDA memory that PyTorch's caching allocator holds and no tensor uses (the model and
    batches of the checkpoint just scored) to the driver; nothing where this process has not used CUDA."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return False
    gc.collect()  # the scored model's tensors that only reference cycles still hold
    torch.cuda.empty_cache()
    return True


def serve(requests, answers):
    """The evaluator process: answer each JSON request line with one JSON line; the log (stderr) has
    a line at the start and at the end of each scoring, with its phases' seconds."""
    from ..data.manifest import read_manifest

    for line in requests:
        req = ScoreRequest.from_json(json.loads(line), "the grid's request", "a request", "see the grid's log")
        t0, phases = time.time(), {}
        LOG.info("scoring %s", req.checkpoint)
        try:
            if req.average:  # score the parameter average of these checkpoints, written first
                from ..checkpoint import write_average

                write_average(list(req.average), req.checkpoint)
                phases["average"] = time.time() - t0
            scores = generate_and_score(list(req.argv), read_manifest(req.data), req.hyp_out, req.compound_split,
                                        phases)
            seconds = time.time() - t0
            answer = {"result": replace(scores, eval_seconds=round(seconds, 2)).to_json()}
            LOG.info("scored %s in %.1f s (%s)", req.checkpoint, seconds,
                     ", ".join(f"{k} {v:.1f} s" for k, v in phases.items()))
        except (LnposError, OSError, RuntimeError, SystemExit) as e:
            answer = {"error": f"scoring {req.checkpoint} failed: {str(e).strip() or type(e).__name__}"}
            LOG.info("%s, after %.1f s", answer["error"], time.time() - t0)
        release_cuda_cache()
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


def main():
    # timestamped log lines, configured before fairseq's import (whose basicConfig then does nothing)
    logging.basicConfig(format=LOG_FORMAT, level=logging.INFO, stream=sys.stderr)
    # the protocol owns the real stdout; anything else printed goes to stderr (the log)
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin, answers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
