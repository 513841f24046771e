"""The cadence of the progress lines (fairseq_lnpos/progress.py), replayed on a simulated clock: the
events of recorded logs, the status lines the cadence adds between them, no gap over a minute."""
import re
from pathlib import Path

import pytest

from fairseq_lnpos.progress import EVERY, SILENCE, TICK, Cadence

RECORDED = Path(__file__).parent / "recorded"


def grid_log_times(path):
    """The seconds of every line of a grid's progress.log (``[grid H:MM:SS] ...``)."""
    times = []
    for line in path.read_text().splitlines():
        m = re.match(r"\[grid (\d+):(\d\d):(\d\d)\]", line)
        if m:
            h, mi, s = map(int, m.groups())
            times.append(3600 * h + 60 * mi + s)
    return times


def replay(events, end):
    """The times of the lines a step prints whose events came at ``events`` (seconds from its start)
    and which ended at ``end``: its event lines and the status lines its cadence added, the ticker's
    wait running a simulated clock (no sleep, no real clock). Returns (time, "event" or "status")."""
    clock = [0.0]
    printed = []
    cadence = Cadence(lambda: printed.append((clock[0], "status")), now=lambda: clock[0])
    pending = sorted(events)

    def wait(seconds):  # the ticker's wait: the step's events until then are printed as they come
        target = clock[0] + seconds
        while pending and pending[0] <= target:
            clock[0] = pending.pop(0)
            printed.append((clock[0], "event"))
            cadence.printed()
        clock[0] = target
        return clock[0] >= end

    cadence.follow(wait)
    return printed


def gaps(times, end):
    points = [0.0, *times, end]
    return [b - a for a, b in zip(points, points[1:])]


# `make demo-real` as it was: its runs' "training (new)" lines, then nothing for 8 min 26 s until the
# first epoch was scored, then the next runs started (the grid's lines came at events only)
DEMO_REAL_START = [0, 0, 506, 507, 1012]


@pytest.mark.parametrize("events", [grid_log_times(RECORDED / "demo_grid_progress.log"), DEMO_REAL_START],
                         ids=["make-demo-grid", "make-demo-real-start"])
def test_no_gap_between_progress_lines_exceeds_a_minute(events):
    end = max(events) + 30
    assert max(gaps(events, end)) > SILENCE  # the recorded lines alone leave silences of over a minute
    printed = replay(events, end)
    times = [t for t, _ in printed]
    assert max(gaps(times, end)) <= SILENCE
    assert [t for t, kind in printed if kind == "event"] == sorted(events)  # every event still printed
    # a status line only where no line came for EVERY seconds: none beside the events
    for (before, _), (t, kind) in zip([(0.0, "start"), *printed], printed):
        if kind == "status":
            assert t - before >= EVERY


def test_a_step_with_frequent_events_gets_no_status_line():
    events = [10.0 * i for i in range(1, 60)]  # an event every 10 s
    assert {kind for _, kind in replay(events, 600)} == {"event"}


def test_a_silent_step_gets_a_status_line_every_every_seconds():
    # the ticker looks every TICK (5) s; the status line once EVERY (55) s have passed since the last line
    assert replay([], 300) == [(t, "status") for t in (55.0, 110.0, 165.0, 220.0, 275.0)]


def test_the_grid_prints_its_status_line_when_no_event_came_for_a_while(tmp_path, capsys):
    """The grid's cadence is fed by every line the grid prints; its status line is the grid's own."""
    from fairseq_lnpos.experiments import options
    from fairseq_lnpos.experiments.scheduler import Grid

    clock = [1000.0]
    grid = Grid([], options.RunOptions(out=str(tmp_path)), [None])
    grid.cadence.now = lambda: clock[0]
    grid.say("a run started")
    clock[0] += EVERY - 1
    assert grid.cadence.tick() is False
    grid.say("an epoch scored")  # an event: the silence starts again
    clock[0] += EVERY - 1
    assert grid.cadence.tick() is False
    clock[0] += 1
    assert grid.cadence.tick() is True
    for e in grid.evaluators.values():
        e.close()
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 3 and printed[-1].endswith("0/0 runs done | ETA ?")  # the status line, no event
    assert len((tmp_path / "progress.log").read_text().splitlines()) == 3


def test_the_ticker_runs_while_the_step_does():
    cadence = Cadence(lambda: None)
    with cadence:
        assert cadence._thread.is_alive()
    assert not cadence._thread.is_alive()
