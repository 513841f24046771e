"""The grid's evaluator: one long-lived process that scores checkpoints as training saves them.

A new ``fairseq-generate`` per epoch spends most of its time importing fairseq and loading; this
process imports fairseq once and then, for each request, runs fairseq-generate's own ``main()``
(evaluate.run_generate: fairseq's SequenceGenerator, the same batches and options as the command)
and scores the hypotheses (evaluate.score_hyps). The grid starts one per device (one on a CPU)
and talks to it through JSON lines: a request on stdin, the result on stdout; fairseq's logging
goes to stderr (the grid's ``evaluator.log``).

:class:`Evaluator` is the grid's side: a queue served by one thread, so training never waits
for scoring; a callback receives each result.
"""
import json
import os
import queue
import subprocess
import sys
import threading
import time

from ..errors import LnposError


class Stopped(Exception):
    """The grid is stopping: a request was not answered."""


class EvalFailed(Exception):
    """The evaluator could not score a checkpoint (the message says why)."""


class Evaluator:
    def __init__(self, env, log_path, launch):
        """``launch(cmd, env, **popen_kwargs)`` starts the process (the grid's, so that it can stop it)."""
        self.env, self.log_path, self.launch = env, log_path, launch
        self.requests = queue.Queue()
        self.proc = None
        self.busy = 0
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def submit(self, request, callback):
        """Score ``request`` (dict: argv, data, hyp_out) when its turn comes; then
        ``callback(result_dict, None)`` or ``callback(None, exception)``."""
        with self.lock:
            self.busy += 1
        self.requests.put((request, callback))

    @property
    def pending(self):
        with self.lock:
            return self.busy

    def close(self):
        self.requests.put(None)
        self.thread.join()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait()

    def _serve(self):
        while True:
            item = self.requests.get()
            if item is None:
                return
            request, callback = item
            try:
                result, error = self._ask(request), None
            except (EvalFailed, Stopped) as e:
                result, error = None, e
            with self.lock:
                self.busy -= 1
            callback(result, error)

    def _ask(self, request):
        if self.proc is None or self.proc.poll() is not None:
            log = open(self.log_path, "ab")
            self.proc = self.launch([sys.executable, "-m", "fairseq_lnpos.experiments.evaluator"], self.env,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
            log.close()
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = b""
        if not line:
            code = self.proc.wait()
            if code < 0:  # killed: the grid is stopping
                raise Stopped()
            raise EvalFailed(f"the evaluator exited ({code}) while scoring {request['checkpoint']}; "
                             f"see {self.log_path}")
        answer = json.loads(line)
        if "error" in answer:
            raise EvalFailed(answer["error"])
        return answer["result"]


def serve(requests, answers):
    """The evaluator process: answer each JSON request line with one JSON line."""
    from ..data.manifest import read_manifest
    from .evaluate import generate_and_score

    for line in requests:
        req = json.loads(line)
        t0 = time.time()
        try:
            result = generate_and_score(req["argv"], read_manifest(req["data"]), req["hyp_out"])
            answer = {"result": {**result, "eval_seconds": round(time.time() - t0, 2)}}
        except (LnposError, OSError, RuntimeError, SystemExit) as e:
            answer = {"error": f"scoring {req['checkpoint']} failed: {str(e).strip() or type(e).__name__}"}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


def main():
    # the protocol owns the real stdout; anything else printed goes to stderr (the log)
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin, answers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
