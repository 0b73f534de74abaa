"""The suite runner's rules (tests/run_suite.py): at most `jobs` units at once, never two
he_heavy units together (their memory peaks would add up), solo units alone."""

import importlib.util
import sys
from pathlib import Path

spec = importlib.util.spec_from_file_location("run_suite", Path(__file__).with_name("run_suite.py"))
run_suite = sys.modules["run_suite"] = importlib.util.module_from_spec(spec)  # its dataclasses look it up
spec.loader.exec_module(run_suite)
Unit, may_start = run_suite.Unit, run_suite._may_start


def test_two_at_a_time_one_heavy_solo_alone():
    heavy, heavy2 = Unit("a.py", "he_heavy", "heavy"), Unit("b.py", "he_heavy", "heavy")
    normal, normal2 = Unit("c.py", "not he_heavy", "normal"), Unit("d.py", "not he_heavy", "normal")
    solo = Unit("e.py", "not he_heavy", "solo")
    assert may_start(heavy, [], 2) and may_start(normal, [heavy], 2)
    assert not may_start(heavy2, [heavy], 2)  # one he_heavy unit at a time
    assert not may_start(normal2, [heavy, normal], 2)  # two at a time
    assert may_start(normal2, [normal], 2) and not may_start(normal2, [normal], 1)
    assert not may_start(solo, [normal], 2) and may_start(solo, [], 2)  # nothing beside a solo unit
    assert not may_start(normal, [solo], 2) and not may_start(heavy, [solo], 2)


def test_no_unit_is_left_for_subprocess_to_reap(tmp_path):
    """The runner reaps its units itself (``wait4``, for their peak RSS), so none of its Popen
    objects may land on ``subprocess``'s list of children dropped while running: the next Popen
    reaps those that have exited, and a unit reaped there never reports (the run then waits for
    it and ends in ECHILD). Unit 1 outlives unit 0 and is running when unit 2 starts."""
    import subprocess

    units = []
    for i, seconds in enumerate((0, 3, 0)):
        f = tmp_path / f"test_unit{i}.py"
        f.write_text(f"import time\n\n\ndef test_wait():\n    time.sleep({seconds})\n")
        units.append(Unit(str(f), "not he_heavy", "normal"))
    run_suite.run(units, 2, tmp_path)
    assert [u.rc for u in units] == [0, 0, 0]
    mine = {u.module for u in units}
    assert not [p for p in subprocess._active if p.args[-1] in mine]  # CPython's list, POSIX


def test_a_unit_never_imports_the_checkouts_folders_by_their_bare_names():
    """A unit starts in the checkout; without PYTHONSAFEPATH, `python -m` and `python -c` put
    it first on sys.path and `import kernels` finds the repository's kernels/ (veil.kernels)
    instead of Hugging Face's `kernels`, which transformers >= 5.25 imports at start-up."""
    import subprocess

    unit = Unit("tests/test_wide.py", "not he_heavy", "normal")
    probe = "import importlib.util as u; s = u.find_spec('kernels'); print(s.origin if s else '')"
    for jobs in (1, 2):
        out = subprocess.run([sys.executable, "-c", probe], cwd=run_suite.ROOT, env=run_suite._env(unit, jobs),
                             capture_output=True, text=True, check=True).stdout.strip()
        assert out != str(Path(run_suite.ROOT).resolve() / "kernels" / "__init__.py"), out


def test_pytest_run_directly_in_the_checkout_does_not_see_its_folders_by_bare_names():
    """`python -m pytest` typed in the checkout, without PYTHONSAFEPATH: tests/conftest.py takes
    the checkout off sys.path, for the tests and for the processes they start."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    probe = f"{Path(__file__).relative_to(run_suite.ROOT)}::test_kernels_is_not_the_checkouts"
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", probe], cwd=run_suite.ROOT,
                         env=env, capture_output=True, text=True)
    assert out.returncode == 0 and "1 passed" in out.stdout, out.stdout[-2000:]


def test_kernels_is_not_the_checkouts():
    import importlib.util
    import os
    import subprocess

    mine = str(Path(run_suite.ROOT).resolve() / "kernels" / "__init__.py")
    spec = importlib.util.find_spec("kernels")
    assert spec is None or spec.origin != mine
    probe = "import importlib.util as u; s = u.find_spec('kernels'); print(s.origin if s else '')"
    child = subprocess.run([sys.executable, "-c", probe], cwd=run_suite.ROOT, env=dict(os.environ),
                           capture_output=True, text=True, check=True).stdout.strip()
    assert child != mine
