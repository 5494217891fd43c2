"""Child processes of long CPU checks (Triton's, a few whole tests), started in the background as soon as collection
ends.

The suite runs in one process on one core (conftest.py: one torch thread), and the Triton checks that need no GPU (the
interpreter's: tests/test_kernels_interpreter.py, test_sampling_interpreter.py, test_moe_ops.py,
test_gated_deltanet_verify.py; the sm_90 compiles: test_kernels_compile_sm90.py) are single-threaded child processes
that need nothing from the parent but their command line. So conftest.py starts the children of the selected tests one
at a time on a background thread when collection ends, and moves those tests to the end of the session: by the time
they run, their child has mostly finished on the otherwise idle second core. A child the thread has not started when
its test asks for it runs in the test's own thread instead, so that both cores stay busy to the end. A test gets its
child's result with ``run_child(argv, interpret)`` (or its last JSON line with ``child_json``): the same command,
environment and timeout whether the child was started in the background or (not started there: pytest-xdist workers,
``-p no:...``, a child not registered) is run right then. A test marks the child it will ask for with
``@pytest.mark.background_child(argv)``, or ``background_child(argv, interpret=False)`` for one that compiles for the
GPU (``TRITON_INTERPRET`` unset).

A whole pytest test can run there too, marked ``@pytest.mark.in_background``: conftest.py registers the child
``pytest_argv(nodeid)`` (that test alone, in a pytest child where ``CE_TEST_CHILD`` is set and the mark does nothing)
and the test in this session passes where the child passed. For long CPU-bound tests that need nothing from the
session (two compiled speculative tests, three tensor-parallel failure scripts), so that the two threads' work stays
balanced.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 600  # per child, counted from its own start
IN_CHILD = os.environ.get("CE_TEST_CHILD") == "1"  # this process is a child (child_env sets it)


Child = tuple[tuple[str, ...], bool]  # (argv, interpret)


def child_env(interpret: bool = True) -> dict:
    pythonpath = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=pythonpath, CE_TEST_CHILD="1")  # a pytest child runs in_background tests itself
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    env.setdefault("OMP_NUM_THREADS", "1")  # one core's work: no spinning intra-op threads against the parent
    return env


def _run(child: Child, on_start=None) -> subprocess.CompletedProcess:
    argv, interpret = child
    proc = subprocess.Popen(list(argv), cwd=REPO, env=child_env(interpret), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    if on_start is not None:
        on_start(proc)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)


class _Background:
    """The children, started one at a time in ``order`` on a thread. A child the thread has not started yet when a
    test asks for it is run by that test's thread instead (``take``), so that neither core waits while the other
    still has children to run."""

    def __init__(self, children: list[Child]):
        self.results: dict[Child, object] = {}
        self.done = {child: threading.Event() for child in children}
        self.order = list(children)
        self.claimed: set[Child] = set()  # started by the thread or by a test
        self.lock = threading.Lock()
        self.started = time.monotonic()
        self.spans: dict[Child, tuple[float, float, str]] = {}  # (start, end) since the thread started, who ran it
        self.current: subprocess.Popen | None = None
        self.stopped = False
        self.thread = threading.Thread(target=self._loop, name="background-children", daemon=True)
        self.thread.start()

    def _claim(self, child: Child) -> bool:
        with self.lock:
            if child in self.claimed:
                return False
            self.claimed.add(child)
            return True

    def _run_and_record(self, child: Child, who: str, on_start=None) -> None:
        start = time.monotonic() - self.started
        try:
            self.results[child] = _run(child, on_start=on_start)
        except BaseException as exc:  # noqa: BLE001  (re-raised in the test that asks)
            self.results[child] = exc
        finally:
            self.spans[child] = (start, time.monotonic() - self.started, who)
            self.done[child].set()

    def _loop(self) -> None:
        for child in self.order:
            if self.stopped:
                break
            if not self._claim(child):
                continue
            try:
                self._run_and_record(child, "background", on_start=lambda p: setattr(self, "current", p))
            finally:
                self.current = None

    def take(self, child: Child) -> object:
        """``child``'s result: run here and now if the thread has not started it, else waited for."""
        if self._claim(child):
            self._run_and_record(child, "test")
        self.done[child].wait()
        return self.results[child]

    def stop(self) -> None:
        self.stopped = True
        proc = self.current
        if proc is not None and proc.poll() is None:
            proc.kill()


_background: _Background | None = None


def start(children: list[Child]) -> None:
    """Starts ``children`` (in this order, one at a time) on a background thread; called by conftest.py."""
    global _background
    if _background is not None or not children or importlib.util.find_spec("triton") is None:
        return
    _background = _Background(list(dict.fromkeys(children)))


def stop() -> None:
    """Kills the child still running (the session ended early); called by conftest.py."""
    if _background is not None:
        _background.stop()


def summary() -> list[str]:
    """Lines for the session's end: each child's seconds and which thread ran it, and how long the background thread
    was busy, beside the session's own length (conftest.py), to balance the two cores' work."""
    if _background is None:
        return []
    spans = _background.spans
    lines = [f"{end - start:7.1f} s  {who:10} {_label(child[0])}" for child, (start, end, who) in spans.items()]
    background = [(start, end) for start, end, who in spans.values() if who == "background"]
    return [f"background children: {len(spans)} of {len(_background.order)} run, {len(background)} by the background "
            f"thread, busy {sum(end - start for start, end in background):.1f} s until "
            f"+{max((end for _, end in background), default=0.0):.1f} s (session +"
            f"{time.monotonic() - _background.started:.1f} s)", *lines]


def _label(argv: tuple[str, ...]) -> str:
    """A child's name in the summary: an ``in_background`` test's whole node id, else its arguments' last 100
    characters (a script's arguments can run to pages)."""
    nodeid = argv[-1]
    return nodeid if list(argv) == pytest_argv(nodeid) else " ".join(argv[1:])[-100:]


def run_child(argv: list[str], interpret: bool = True) -> subprocess.CompletedProcess:
    """The finished child ``argv``: its background run's result, waited for, or a run started now."""
    key = (tuple(argv), interpret)
    if _background is not None and key in _background.done and not _background.stopped:
        result = _background.take(key)
        if isinstance(result, BaseException):
            raise result
        return result
    return _run(key)


def pytest_argv(nodeid: str) -> list[str]:
    """The child that runs the test ``nodeid`` alone (an ``in_background`` test)."""
    return [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", nodeid]  # -rs: skip reasons


def child_json(argv: list[str], interpret: bool = True):
    """The last line of the finished child ``argv``'s output that is a JSON object (its checks' results), asserted
    to exist with the child's exit status 0."""
    proc = run_child(argv, interpret)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, f"child {argv[1:]} failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1])
