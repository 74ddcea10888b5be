"""The warm parent (memfit.memory.warm) on its own: a script or a module forked with its
own argv, environment, working directory and output files, its exit status reported back,
and a variable read at import sent back to a cold start. The frameworks are not imported
here (the parent imports `json`): memfit run's warm start (tests/supervise/test_warm.py)
and the measuring children (tests/estimate/test_warm_children.py) try it with TensorFlow.
"""

import json
import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from memfit import exitcodes
from memfit.memory.warm import WarmParent, WarmStartError, cold_reason


@pytest.fixture
def parent():
    with WarmParent(sys.executable, (), ("json",), {"WARM_TEST": "parent"}).open(timeout=60) as p:
        yield p


def files(tmp_path: Path) -> tuple[str, str]:
    out, err = tmp_path / "out", tmp_path / "err"
    out.touch()
    err.touch()
    return str(out), str(err)


def test_a_script_runs_with_its_argv_env_cwd_and_output_files(parent, tmp_path):
    script = tmp_path / "s.py"
    script.write_text(textwrap.dedent("""
        import json, os, sys
        print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "name": __name__,
                          "env": os.environ.get("WARM_TEST"), "path0": sys.path[0]}))
        print("to stderr", file=sys.stderr)
        raise SystemExit(7)
    """))
    out, err = files(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    here = os.getcwd()
    os.chdir(work)
    try:
        child = parent.start({"WARM_TEST": "child"}, ["s.py", "--epochs", "3"],
                             script=str(script), output=(out, err))
    finally:
        os.chdir(here)
    assert child.wait(timeout=60) == 7
    seen = json.loads(Path(out).read_text())
    assert seen == {"argv": ["s.py", "--epochs", "3"], "cwd": str(work), "name": "__main__",
                    "env": "child", "path0": str(tmp_path)}
    assert Path(err).read_text() == "to stderr\n"


def test_a_module_runs_as_python_dash_m_would(parent, tmp_path):
    (tmp_path / "warm_probe_mod.py").write_text(
        "import sys\nprint(__name__, sys.argv[1:], sys.argv[0].endswith('warm_probe_mod.py'))\n")
    out, err = files(tmp_path)
    here = os.getcwd()
    os.chdir(tmp_path)          # as `python -m`, the working directory is on the path
    try:
        child = parent.start({}, ["-m", "a", "b"], module="warm_probe_mod", output=(out, err))
        assert child.wait(timeout=60) == 0
    finally:
        os.chdir(here)
    assert Path(out).read_text() == "__main__ ['a', 'b'] True\n", Path(err).read_text()


def test_a_variable_read_at_import_changed_by_the_child_asks_for_a_cold_start(parent,
                                                                            tmp_path):
    script = tmp_path / "sets.py"
    script.write_text("import os\nos.environ['TF_SOMETHING'] = '1'\nprint('not reached')\n")
    out, err = files(tmp_path)
    child = parent.start({}, ["sets.py"], script=str(script), output=(out, err),
                         who="memfit find-batch-size")
    assert child.wait(timeout=60) == exitcodes.START_COLD
    assert Path(out).read_text() == ""
    said = Path(err).read_text()
    assert ("sets.py sets TF_SOMETHING='1' (the warm parent imported the frameworks with "
            "None); memfit find-batch-size starts it again as a new interpreter" in said)
    assert cold_reason(said) == ("sets.py sets TF_SOMETHING='1' (the warm parent imported "
                                 "the frameworks with None)")


def test_a_killed_child_is_reported_killed_and_the_parent_serves_on(parent, tmp_path):
    script = tmp_path / "sleeps.py"
    script.write_text("import time\ntime.sleep(60)\n")
    out, err = files(tmp_path)
    child = parent.start({}, ["sleeps.py"], script=str(script), output=(out, err))
    assert child.poll() is None
    child.kill()
    assert child.wait(timeout=30) == -signal.SIGKILL
    quick = tmp_path / "quick.py"
    quick.write_text("print('served')\n")
    again = parent.start({}, ["quick.py"], script=str(quick), output=(out, err))
    assert again.wait(timeout=60) == 0 and parent.alive
    assert Path(out).read_text() == "served\n"


def test_start_needs_one_of_a_script_or_a_module(parent):
    with pytest.raises(ValueError, match="give a script or a module"):
        parent.start({}, ["x"])


def test_a_dead_warm_parent_fails_the_next_start(tmp_path):
    p = WarmParent(sys.executable, (), ("json",), {}).open(timeout=60)
    try:
        os.kill(p.proc.pid, signal.SIGKILL)
        p.proc.wait()
        assert not p.alive
        with pytest.raises(WarmStartError):
            p.start({}, ["x"], module="json.tool")
    finally:
        p.close()


def test_ctrl_c_while_the_warm_parent_imports_ends_it_too(tmp_path):
    # A stranger's Ctrl-C in the first seconds of find-batch-size: the CLI said
    # "interrupted" and exited, and the warm parent (which ignores SIGINT) went on
    # importing TensorFlow for 20 s more, an orphan nobody waited for.
    import memfit

    (tmp_path / "slow_import.py").write_text("import time\ntime.sleep(60)\n")
    path = os.pathsep.join([str(tmp_path), str(Path(memfit.__file__).parents[1]),
                            os.environ.get("PYTHONPATH", "")])
    p = WarmParent(sys.executable, (), ("slow_import",), {"PYTHONPATH": path})

    def interrupt(*_):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        with pytest.raises(KeyboardInterrupt):
            p.open(timeout=60)
        assert p.proc is not None and p.proc.poll() is not None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if p.proc is not None and p.proc.poll() is None:
            p.proc.kill()
            p.proc.wait()


def test_a_tied_warm_parent_and_its_child_die_with_the_process_that_started_them(tmp_path):
    """find-batch-size's warm parent is tied: a CLI killed by SIGKILL (nothing of it runs
    to close anything) takes the warm parent and the measuring child with it, instead of
    leaving the child to run on, held to a budget by nobody."""
    import subprocess

    import psutil

    sleeper = tmp_path / "sleeps.py"
    sleeper.write_text("import time\ntime.sleep(120)\n")
    code = textwrap.dedent(f"""
        import sys, time
        from memfit.memory.warm import WarmParent
        p = WarmParent(sys.executable, (), ("json",), {{}}, tied=True).open(timeout=60)
        c = p.start({{}}, ["sleeps.py"], script={str(sleeper)!r})
        print(p.proc.pid, c.pid, flush=True)
        time.sleep(120)
    """)
    requester = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                 text=True)
    parent_pid, child_pid = map(int, requester.stdout.readline().split())
    assert psutil.pid_exists(parent_pid) and psutil.pid_exists(child_pid)
    requester.kill()
    requester.wait()
    gone, alive = psutil.wait_procs([psutil.Process(parent_pid), psutil.Process(child_pid)],
                                    timeout=10)
    assert alive == []
    # untied (memfit run's), the same parent would have outlived it


def test_a_forked_scripts_tracebacks_are_its_own_even_under_two_ctrl_cs(parent, tmp_path):
    """A stranger's Ctrl-C in a warm `memfit run` reached the training twice (from the
    terminal, and passed on by memfit run): the second interrupted the printing of the
    first, and three chained tracebacks ran through memfit.memory.warm. A new interpreter
    prints the script's own traceback once; so does a fork now, for a crash too. (The
    second Ctrl-C is sent while the traceback is printed: by the exception's __str__.)"""
    script = tmp_path / "t.py"
    script.write_text(textwrap.dedent("""
        import os, signal, sys, time
        class Interrupted(KeyboardInterrupt):
            def __str__(self):
                os.kill(os.getpid(), signal.SIGINT)      # memfit run's, while printing
                time.sleep(0.2)
                return "twice"
        def step():
            if sys.argv[1] == "crash":
                raise RuntimeError("boom")
            raise Interrupted                            # the terminal's Ctrl-C
        step()
    """))
    for how, codes, last in (("ctrl-c", (-signal.SIGINT, 128 + signal.SIGINT),
                              "Interrupted: twice"), ("crash", (1,), "RuntimeError: boom")):
        (tmp_path / how).mkdir()
        out, err = files(tmp_path / how)
        child = parent.start({}, ["t.py", how], script=str(script), output=(out, err))
        assert child.wait(timeout=60) in codes, how
        text = Path(err).read_text()
        assert text.count("Traceback") == 1 and "warm.py" not in text, text
        assert text.splitlines()[1].strip() == f'File "{script}", line 12, in <module>', text
        assert text.rstrip().endswith(last), text
