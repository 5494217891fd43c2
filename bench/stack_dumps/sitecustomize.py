"""Whole-stack dumps of every Python process that starts with this folder on its PYTHONPATH (a start-up diagnosis).

    EXTRA_PYTHONPATH=$PWD/bench/stack_dumps CE_STACK_DUMP_S=60 bash bench/gpu_session.sh   # or PYTHONPATH=...

Every ``CE_STACK_DUMP_S`` seconds (default 60) a daemon thread prints the main thread's stack to stderr, outermost
frame first, a run of identical frames collapsed into one line with its count. Why not
``faulthandler.dump_traceback_later``: it keeps only the innermost 100 frames, so a deep recursion hides its caller
(bench/results/h200-2026-11-29/run20-add-norm-linear: Inductor's IR printing, caller unknown).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback


def collapsed_stack(frame) -> list[str]:
    """``file:line function`` of each frame from the outermost in, runs of one frame as one line ``... xN``."""
    lines: list[str] = []
    count = 0
    for entry in traceback.extract_stack(frame):
        line = f"{entry.filename}:{entry.lineno} {entry.name}"
        if lines and lines[-1] == line:
            count += 1
            continue
        if count:
            lines[-1] += f"  x{count + 1}"
        lines.append(line)
        count = 0
    if count:
        lines[-1] += f"  x{count + 1}"
    return lines


def _watch(interval: float) -> None:
    main = threading.main_thread()
    start = time.monotonic()
    while main.is_alive():
        time.sleep(interval)
        frame = sys._current_frames().get(main.ident)
        if frame is None:
            return
        stack = "\n".join("  " + line for line in collapsed_stack(frame))
        print(f"[stack dump, pid {os.getpid()}, +{time.monotonic() - start:.0f} s]\n{stack}", file=sys.__stderr__,
              flush=True)


threading.Thread(target=_watch, args=(float(os.environ.get("CE_STACK_DUMP_S", "60")),), daemon=True,
                 name="stack-dumps").start()
