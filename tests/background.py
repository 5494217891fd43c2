"""Triton-interpreter children, started in the background as soon as collection ends.

The suite runs in one process on one core (conftest.py: one torch thread), and the interpreter checks
(tests/test_sampling_interpreter.py, tests/test_moe_ops.py, tests/test_gated_deltanet_verify.py) are single-threaded
child processes that need nothing from the parent but their command line. So conftest.py starts the children of the
selected tests one at a time on a background thread when collection ends, and moves those tests to the end of the
session: by the time they run, their child has mostly finished on the otherwise idle second core. A test gets its
child's result with ``run_child(argv)``: the same command, environment and timeout whether the child was started in
the background or (not started there: pytest-xdist workers, ``-p no:...``, a child not registered) is run right
then. A test marks the child it will ask for with ``@pytest.mark.interpreter_child(argv)``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 600  # per child, counted from its own start


def child_env() -> dict:
    pythonpath = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=pythonpath)
    env.setdefault("OMP_NUM_THREADS", "1")  # one core's work: no spinning intra-op threads against the parent
    return env


def _run(argv: tuple[str, ...], on_start=None) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(list(argv), cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
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
    def __init__(self, argvs: list[tuple[str, ...]]):
        self.results: dict[tuple[str, ...], object] = {}
        self.done = {argv: threading.Event() for argv in argvs}
        self.order = list(argvs)
        self.current: subprocess.Popen | None = None
        self.stopped = False
        self.thread = threading.Thread(target=self._loop, name="interpreter-children", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        for argv in self.order:
            if self.stopped:
                break
            try:
                self.results[argv] = _run(argv, on_start=lambda p: setattr(self, "current", p))
            except BaseException as exc:  # noqa: BLE001  (re-raised in the test that asks)
                self.results[argv] = exc
            finally:
                self.current = None
                self.done[argv].set()

    def stop(self) -> None:
        self.stopped = True
        proc = self.current
        if proc is not None and proc.poll() is None:
            proc.kill()


_background: _Background | None = None


def start(argvs: list[tuple[str, ...]]) -> None:
    """Starts ``argvs`` (in this order, one at a time) on a background thread; called by conftest.py."""
    global _background
    if _background is not None or not argvs or importlib.util.find_spec("triton") is None:
        return
    _background = _Background(list(dict.fromkeys(argvs)))


def stop() -> None:
    """Kills the child still running (the session ended early); called by conftest.py."""
    if _background is not None:
        _background.stop()


def run_child(argv: list[str]) -> subprocess.CompletedProcess:
    """The finished child ``argv``: its background run's result, waited for, or a run started now."""
    key = tuple(argv)
    if _background is not None and key in _background.done and not _background.stopped:
        _background.done[key].wait()
        result = _background.results[key]
        if isinstance(result, BaseException):
            raise result
        return result
    return _run(key)
