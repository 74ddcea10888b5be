"""The probe's pieces in this process: arrays alive, tf.data buffers, the site shim."""

import os
import subprocess
import sys

import numpy as np
import pytest

from memfit.doctor import site
from memfit.doctor.arrays import fit_arrays, resident_arrays

MiB = 2**20


def test_resident_arrays_counts_owners_once_and_names_them(tmp_path):
    held = np.ones((4 * MiB,), np.uint8)
    view = held[::2]                                  # a view: counted with its owner
    mapped_path = tmp_path / "m.npy"
    np.save(mapped_path, np.zeros(3 * MiB, np.uint8))
    mapped = np.load(mapped_path, mmap_mode="r")
    found = {a.nbytes: a for a in resident_arrays(min_bytes=MiB)}
    assert "held" in found[4 * MiB].names and not found[4 * MiB].mapped
    assert found[3 * MiB].mapped
    assert view.base is held and mapped.shape == (3 * MiB,)


MODULE_LISTS = """
import numpy as np
from memfit.doctor.arrays import resident_arrays
A = B = C = D = E = F = G = H = I = J = 1             # a module with many globals
KEPT = [np.ones((64, 1024), "float32") for _ in range(10)]    # short: 10 x 256 KiB
HIST = [np.ones((100, 100)) for _ in range(40)]               # 40 x 80 KB
for a in resident_arrays(min_bytes=2**20):
    print(a.names, a.container, a.nbytes)
"""


def test_module_level_lists_of_arrays_are_named_not_their_module(tmp_path):
    """A stranger's module-level list of arrays was "unnamed: a dict of 16 dicts/lists":
    the script's globals claimed its arrays."""
    out = _python(MODULE_LISTS, {}, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "('HIST',) list of 40 arrays 3200000", "('KEPT',) list of 10 arrays 2621440"]


def test_fit_arrays_reads_nested_arguments():
    x = {"image": np.zeros((10, 8), np.float32), "meta": np.zeros((10, 2), np.float32)}
    y = np.zeros((10, 1), np.float32)
    infos = fit_arrays({"x": x, "y": y, "validation_data": (x["image"][:5], y[:5])})
    names = {a.names[0]: a.nbytes for a in infos}
    assert names == {"x['image']": 320, "x['meta']": 80, "y": 40}   # views: their owner once


def test_pipeline_buffers_tensors_and_cache():
    tf = pytest.importorskip("tensorflow")
    from memfit.doctor.pipeline import inspect_dataset

    data = np.zeros((100, 8, 8, 3), np.float32)
    ds = (tf.data.Dataset.from_tensor_slices((data, np.zeros(100, np.float32)))
          .cache().shuffle(1000).batch(10).prefetch(4))
    info = inspect_dataset(ds)
    assert info.tensors_bytes == data.nbytes + 400 and info.batch_size == 10
    kinds = {b.kind: b for b in info.buffers}
    assert kinds["shuffle"].elements == 100           # the input is shorter than the buffer
    assert kinds["shuffle"].bytes == 100 * (8 * 8 * 3 * 4 + 4)
    assert kinds["cache"].bytes == kinds["shuffle"].bytes
    assert kinds["prefetch"].bytes == 4 * 10 * (8 * 8 * 3 * 4 + 4)
    auto = inspect_dataset(tf.data.Dataset.range(5).prefetch(tf.data.AUTOTUNE))
    assert auto.buffers == ()
    with pytest.raises(ValueError, match="Received: ds of type list"):
        inspect_dataset([1, 2])


def _python(code, env, cwd):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env}, cwd=cwd, timeout=60)


def test_shim_chains_to_an_existing_sitecustomize(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS'] = 'ran'\n")
    site_dir = site.prepare(tmp_path / "wd")
    env = site.environment(site_dir, tmp_path / "wd" / ".doctor", "t", steps=3)
    env["PYTHONPATH"] = f"{site_dir}{os.pathsep}{theirs}"
    out = _python("import os, sys; print(os.environ.get('THEIRS'), "
                  "'keras' in sys.modules, 'numpy' in sys.modules)", env, tmp_path)
    assert out.returncode == 0 and out.stdout.split() == ["ran", "False", "False"], out.stderr
    off = {k: v for k, v in env.items() if k != "MEMFIT_DOCTOR"}
    out = _python("import os; print(os.environ.get('THEIRS'))", {**off, "MEMFIT_DOCTOR": ""},
                  tmp_path)
    assert out.stdout.split() == ["ran"], out.stderr


def test_shim_survives_a_missing_hook(tmp_path):
    site_dir = site.prepare(tmp_path)
    env = site.environment(site_dir, tmp_path / ".doctor", "t", steps=3)
    env["MEMFIT_DOCTOR_HOOK"] = str(tmp_path / "missing.py")
    out = _python("print('still runs')", env, tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "still runs"
    assert "memfit doctor: the probe did not load" in out.stderr
