"""memfit without TensorFlow, Keras or JAX (issue 26): the process tools and the packer work,
and every capability that needs a framework says in one line which extra installs it.

The frameworks are made absent the way a machine without them is: every Python process of
the test (memfit, and the commands it starts) gets a ``sitecustomize`` that makes the path
finder find no ``tensorflow``, ``keras`` or ``jax`` on any path entry, so that importing them
raises ``ModuleNotFoundError`` and ``importlib.util.find_spec`` finds nothing, as where they
are not installed.
"""

import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ABSENT = ("tensorflow", "keras", "jax", "jaxlib", "torch", "tf_keras")

SITE = textwrap.dedent(f"""
    import importlib.machinery

    _find = importlib.machinery.PathFinder.find_spec

    def _find_spec(fullname, path=None, target=None):
        if fullname.split(".")[0] in {ABSENT!r}:
            return None                     # not on any path entry: not installed
        return _find(fullname, path, target)

    importlib.machinery.PathFinder.find_spec = staticmethod(_find_spec)
""")


@pytest.fixture
def bare(tmp_path):
    """Runs ``python ARGS`` (or ``memfit ARGS``) as on a machine without the frameworks."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT / "src")]),
           "MEMFIT_CACHE_DIR": str(tmp_path / "cache")}

    def run(*args: str, memfit: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        command = [sys.executable, *(("-m", "memfit") if memfit else ()), *args]
        return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=timeout)

    return run


def test_the_blocker_makes_the_frameworks_absent(bare):
    out = bare("-c", "import tensorflow", memfit=False)
    assert out.returncode == 1 and "No module named 'tensorflow'" in out.stderr


def test_import_pack_inspect_and_verify_need_no_framework(bare):
    out = bare("-c", textwrap.dedent("""
        import sys
        import numpy as np
        import memfit
        memfit.pack({"x": np.zeros((64, 3), "float32"), "y": np.arange(64)}, "ds",
                    shards=2, progress=False)
        memfit.pack({"x": np.zeros((64, 3), "float32")}, "arr", format="arrays",
                    progress=False)
        print(memfit.verify("ds"))
        print(memfit.inspect("ds"))
        assert not {"tensorflow", "keras", "jax"} & set(sys.modules)
        print("ok")
    """), memfit=False)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]
    for args in (("inspect", "ds"), ("verify", "ds"), ("pack", "arr/train/x.npy", "-o", "p2")):
        out = bare(*args)
        assert out.returncode == 0, (args, out.stderr[-2000:])


def test_watch_run_report_and_share_of_any_command_need_no_framework(bare, tmp_path):
    hold = "import time; x = bytearray(30_000_000); time.sleep(0.5); print('done')"
    out = bare("watch", "--", sys.executable, "-c", hold)
    assert out.returncode == 0 and "done" in out.stdout, out.stderr[-2000:]
    out = bare("run", "--workdir", "wd", "--", sys.executable, "-c", hold)
    assert out.returncode == 0 and "done" in out.stdout, out.stderr[-2000:]
    out = bare("report", "wd")
    assert out.returncode == 0 and (tmp_path / "wd" / "timeline.png").stat().st_size > 0, \
        out.stderr[-2000:]
    (tmp_path / "jobs.toml").write_text(textwrap.dedent(f"""
        budget = "1GiB"
        device = "cpu"
        [[job]]
        name = "a"
        command = [{sys.executable!r}, "-c", {hold!r}]
        need = "64MiB"
        [[job]]
        name = "b"
        command = [{sys.executable!r}, "-c", "print('b')"]
        need = "32MiB"
        restart = true
    """))
    out = bare("share", "jobs.toml", "--workdir", "sw")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert out.stderr.count("finished") >= 2 or out.stdout.count("finished") >= 2, \
        out.stdout + out.stderr


@pytest.mark.parametrize("args", [
    ("estimate", "mymodels:make", "--batch-size", "8"),
    ("find-batch-size", "mymodels:make", "--budget", "1GiB"),
    ("calibrate",),
])
def test_a_command_that_needs_tensorflow_says_which_extra_in_one_line(bare, args):
    out = bare(*args)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2, out.stderr[-2000:]
    assert len(lines) == 1 and "pip install 'memfit[tensorflow]'" in lines[0], out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("name", ["dataset", "session", "MemoryMonitor"])
def test_python_entry_points_that_need_a_framework_raise_one_clear_error(bare, name):
    out = bare("-c", textwrap.dedent(f"""
        import memfit
        from memfit.errors import FrameworkMissingError
        try:
            memfit.{name}
        except ImportError as e:
            assert isinstance(e, FrameworkMissingError), type(e)
            print(e)
    """), memfit=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"memfit.{name}" in out.stdout and "pip install 'memfit[tensorflow]'" in out.stdout


def test_memfit_installs_without_a_framework():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    needed = {d.split(";")[0].split("[")[0].split("=")[0].split(">")[0].split("<")[0]
              .split("~")[0].strip().lower() for d in project["dependencies"]}
    assert not needed & set(ABSENT), needed
    extra = project["optional-dependencies"]["tensorflow"]
    assert any(d.startswith("tensorflow>=") for d in extra), extra
    makefile = (ROOT / "Makefile").read_text()
    assert "tensorflow" in makefile.split("pip install --quiet -e")[1].splitlines()[0], \
        "make test must install the tensorflow extra"
