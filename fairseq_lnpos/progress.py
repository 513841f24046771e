"""The cadence of the progress lines of every step that runs for minutes: the grid (the demos' runs,
the maps' sweeps), the demo's other steps and the Fig. 3 analysis.

A step prints a line at each event it sees (a run started, an epoch scored, a model measured) and
tells its :class:`Cadence` so (:meth:`Cadence.printed`); between events the cadence's ticker prints
the step's status line (what runs, how far, the time left) as soon as no line came for ``every``
seconds. The ticker looks every ``tick`` seconds, so no two lines are more than ``every + tick`` =
:data:`SILENCE` seconds apart. The clock and the ticker's wait are arguments: a test replays a
recorded log on a simulated clock.
"""
import threading
import time

SILENCE = 60.0  # seconds: the longest gap between two progress lines of a long step
TICK = 5.0  # seconds between two looks of the ticker
EVERY = SILENCE - TICK  # no line for this long: the status line is printed


class Cadence:
    """When a step's status line is due. ``beat()`` prints the status line; every other progress line
    of the step is followed by :meth:`printed`. ``now``: the clock, in seconds. As a context manager,
    a daemon thread ticks while the step runs (:meth:`follow`)."""

    def __init__(self, beat, now=time.monotonic, every=EVERY, tick=TICK):
        self.beat, self.now, self.every, self.tick_seconds = beat, now, every, tick
        self.last = now()
        self._stop = threading.Event()
        self._thread = None

    def printed(self):
        """A progress line was printed now."""
        self.last = self.now()

    def tick(self):
        """Print the status line when no line came for ``every`` seconds; True when it did."""
        if self.now() - self.last < self.every:
            return False
        self.beat()
        self.printed()
        return True

    def follow(self, wait):
        """Tick every ``tick`` seconds until ``wait(tick)`` returns true (the stop event's ``wait``)."""
        while not wait(self.tick_seconds):
            self.tick()

    def __enter__(self):
        self._stop.clear()
        self.printed()
        self._thread = threading.Thread(target=self.follow, args=(self._stop.wait,), daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        return False
