"""The ``in_background`` mark (tests/conftest.py, tests/background.py): a marked test runs alone in a pytest child,
and the test in the session passes, fails or skips as its child did.

No other test checks the mechanism itself, and a broken proxy would hide failures: every ``in_background`` test would
report whatever the proxy says. So a real pytest session (a subprocess) runs a small generated file under the
mechanism, unmodified: tests/conftest.py and tests/background.py are copied into a temporary tree, whose root
stands for the repository (background.py runs each child there, and its nodeids are relative to it). Marked there:
a test that passes, one that fails with a distinctive message, one that skips with a distinctive reason; one test
is unmarked. Oracles independent of the proxy:
* the session's JUnit XML report: each test's outcome and message, and the order the tests ran in;
* a log the test bodies append to: which body ran, in which process (pid), with ``CE_TEST_CHILD`` set or not.

Fast: tests/hf_models.py, which the conftest imports but this mechanism does not use, is replaced by a stub (the real
one imports transformers, ~4 s), and the children import only pytest: they load no conftest (the generated tree has
none; its pytest.ini registers the mark) and no plugin of an installed package (PYTEST_DISABLE_PLUGIN_AUTOLOAD, set for
the session and inherited by them; the mechanism uses none). About 4 s on a 2-core machine, mostly the session's torch
import.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
FAILURE = "DISTINCTIVE-FAILURE-5f0c2e"
SKIP_REASON = "DISTINCTIVE-SKIP-REASON-a93d71"

PYTEST_INI = """\
[pytest]
markers =
    in_background: stand-in for tests/conftest.py's registration (the children load no conftest)
"""

# Stands in for tests/hf_models.py: the conftest reads these at import and in fixtures this file never uses.
HF_MODELS_STUB = "BUILDERS = {}\nMOE_BUILDERS = {}\n"

# The generated test file. Defined last but unmarked, test_in_the_parent runs first (the conftest moves marked
# tests to the end). When the session started the children on its background thread, it waits there for the first
# child's body to have run: the children run while the session is still busy with earlier tests.
PROBE = f'''\
import os
import time
from pathlib import Path

import pytest

LOG = Path(__file__).with_name("bodies.log")


def record(name, **extra):
    with open(LOG, "a") as log:
        log.write(repr(dict(name=name, pid=os.getpid(), child=os.environ.get("CE_TEST_CHILD"), **extra)) + "\\n")


def first_child_has_run():
    return LOG.exists() and "'test_passes'" in LOG.read_text()


@pytest.mark.in_background
def test_passes():
    record("test_passes")


@pytest.mark.in_background
def test_fails():
    record("test_fails")
    assert False, "{FAILURE}"


@pytest.mark.in_background
def test_skips():
    record("test_skips")
    pytest.skip("{SKIP_REASON}")


def test_in_the_parent():
    from tests import background

    started = background._background is not None
    deadline = time.monotonic() + 120
    while started and not first_child_has_run() and time.monotonic() < deadline:
        time.sleep(0.05)
    record("test_in_the_parent", started=started, first_child_had_run=first_child_has_run())
'''


@dataclass
class Session:
    pid: int  # the parent pytest process
    returncode: int
    output: str  # its stdout and stderr
    reports: dict[str, ET.Element]  # test name -> its JUnit <testcase>, in the order the tests ran
    bodies: list[dict]  # the log's records, in the order they were written


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Session:
    """One pytest session over the generated file, under copies of the current tests/conftest.py and background.py."""
    root = tmp_path_factory.mktemp("background_root")
    (root / "tests").mkdir()
    for name in ("conftest.py", "background.py"):
        shutil.copyfile(TESTS / name, root / "tests" / name)
    (root / "tests" / "__init__.py").write_text("")  # a regular package: found before any other `tests` on the path
    (root / "tests" / "hf_models.py").write_text(HF_MODELS_STUB)
    (root / "pytest.ini").write_text(PYTEST_INI)
    (root / "test_probe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "CE_TEST_CHILD"))}  # xdist, addopts
    env["PYTHONPATH"] = str(root)  # `tests` is the copy (the conftest's `from tests import background`)
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # nor hypothesis's pytest plugin: ~1.5 s a child; inherited by them
    argv = [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-rA",
            f"--junitxml={root / 'report.xml'}", "test_probe.py"]
    proc = subprocess.Popen(argv, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        pytest.fail(f"the session over the generated file did not finish in 300 s:\n{output[-4000:]}")
    if not (root / "report.xml").exists():
        pytest.fail(f"the session over the generated file wrote no report (exit status {proc.returncode}):\n"
                    f"{output[-4000:]}")
    reports = {case.get("name"): case for case in ET.parse(root / "report.xml").getroot().iter("testcase")}
    log = root / "bodies.log"
    bodies = [ast.literal_eval(line) for line in log.read_text().splitlines()] if log.exists() else []
    return Session(proc.pid, proc.returncode, output, reports, bodies)


def outcome(case: ET.Element) -> str:
    for tag in ("failure", "error", "skipped"):
        if case.find(tag) is not None:
            return tag
    return "passed"


def test_outcomes_are_the_childrens(session: Session):
    """The session reports each marked test as its child ended: passed, failed, skipped (the unmarked one passed),
    and exits with status 1 (tests failed)."""
    got = {name: outcome(case) for name, case in session.reports.items()}
    want = {"test_passes": "passed", "test_fails": "failure", "test_skips": "skipped", "test_in_the_parent": "passed"}
    assert got == want, session.output[-4000:]
    assert session.returncode == 1, session.output[-4000:]


def test_a_failure_shows_the_childs_output(session: Session):
    """The failed test's report carries the child's own failure (its assertion message), so that a failure in the
    background can be diagnosed from the session's output alone."""
    case = session.reports["test_fails"].find("failure")
    assert case is not None, session.output[-4000:]
    assert FAILURE in case.get("message", "") + (case.text or ""), session.output[-4000:]
    assert FAILURE in session.output


def test_a_skip_says_the_child_skipped(session: Session):
    """The skipped test's reason names the child's outcome (its summary line: ``1 skipped``)."""
    case = session.reports["test_skips"].find("skipped")
    assert case is not None and "1 skipped" in case.get("message", ""), session.output[-4000:]


def test_a_skip_carries_the_childs_reason(session: Session):
    """The skipped test's reason includes the reason its child gave to pytest.skip (the child's ``-rs`` line)."""
    case = session.reports["test_skips"].find("skipped")
    assert case is not None and SKIP_REASON in case.get("message", ""), session.output[-4000:]


def test_each_marked_body_runs_once_alone_in_a_child(session: Session):
    """Each marked test's body ran exactly once, in a process of its own that is not the session's and has
    ``CE_TEST_CHILD=1`` (so its mark does nothing there: no grandchild); the unmarked test ran in the session itself.
    The marked tests ran after the unmarked one, defined after them. Where the session started its children in the
    background (tests/background.py: Triton installed), the first child had finished its body while the unmarked
    test was still running; otherwise (each run when its test runs) no child's body had run by then."""
    names = [record["name"] for record in session.bodies]
    assert sorted(names) == sorted(["test_passes", "test_fails", "test_skips", "test_in_the_parent"]), names
    children = [record for record in session.bodies if record["name"] != "test_in_the_parent"]
    assert all(record["child"] == "1" for record in children), children
    assert len({record["pid"] for record in children} | {session.pid}) == 4, (session.pid, children)
    (parent,) = [record for record in session.bodies if record["name"] == "test_in_the_parent"]
    assert parent["pid"] == session.pid and parent["child"] is None, (session.pid, parent)
    assert list(session.reports) == ["test_in_the_parent", "test_passes", "test_fails", "test_skips"]
    assert parent["started"] == (importlib.util.find_spec("triton") is not None), parent
    assert parent["first_child_had_run"] == parent["started"], parent


def test_the_summary_names_each_child_by_its_test(session: Session):
    """Where the session ran children in the background, its end lists each one's seconds by the marked test's node id
    (the arguments before it are the same for every such child)."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("no background thread without Triton")
    lines = session.output.split("background children: ", 1)[-1].splitlines()[1:4]
    labels = sorted(line.split(None, 3)[-1] for line in lines)  # "<seconds> s  <thread> <label>"
    assert labels == [f"test_probe.py::{name}" for name in ("test_fails", "test_passes", "test_skips")], lines


def test_a_child_not_yet_started_runs_in_the_thread_that_asks_for_it():
    """While the background thread runs its first child (a 3-second sleep), a test asking for the second child runs
    it itself at once, instead of waiting for the thread to get there; the thread then skips it. Oracles: the
    children's own output and the wall clock."""
    import time

    from tests import background

    slow = ((sys.executable, "-c", "import time; time.sleep(3); print('slow')"), False)
    quick = ((sys.executable, "-c", "print('quick')"), False)
    started = time.monotonic()
    children = background._Background([slow, quick])
    try:
        result = children.take(quick)
        assert result.stdout.strip() == "quick" and time.monotonic() - started < 2.5
        assert children.spans[quick][2] == "test"
        assert children.take(slow).stdout.strip() == "slow"
        children.thread.join(timeout=10)
        assert children.spans[slow][2] == "background" and not children.thread.is_alive()
        assert list(children.spans) == [quick, slow]  # the thread did not run the quick child again
    finally:
        children.stop()
