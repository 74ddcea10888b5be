"""The estimate on Keras's JAX backend (XLA's buffer assignment of the compiled step), and
the measuring child and find-batch-size there. Each test runs in a child process started
with KERAS_BACKEND=jax, so that the suite's own Keras (on TensorFlow) is left alone."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("jax")

HERE = Path(__file__).parent


def jax_run(*args, code=None, timeout=300, tmp_path=None):
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE),
                                                       os.environ.get("PYTHONPATH")]))}
    if tmp_path is not None:
        env["MEMFIT_CACHE_DIR"] = str(tmp_path)
    cmd = [sys.executable, "-c", textwrap.dedent(code)] if code else \
        [sys.executable, "-m", "memfit", *args]
    return subprocess.run(cmd, cwd=HERE, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """A cache the CLI's estimate and the search share: the first of them to run measures
    the JAX baseline there (a child, about 4 CPU-s), the other reads it, as a user's second
    command does."""
    return tmp_path_factory.mktemp("jax-cache")


def test_memfit_estimate_on_jax_gives_xla_s_estimate_and_a_verdict(calibrated):
    done = jax_run("estimate", "models:tiny", "--batch-size", "8", "--budget", "1GiB",
                   tmp_path=calibrated)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "kernels: XLA's, on the CPU" in done.stdout
    assert "XLA temporaries" in done.stdout
    assert "budget 1.0 GiB: batch 8 fits" in done.stdout
    # stderr: at most the one line that says the JAX baseline was measured, no JAX noise
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) <= 1 and all("JAX baseline" in ln for ln in lines), done.stderr
    assert "Unable to initialize backend" not in done.stderr


def test_xla_s_parts_add_up_and_the_range_holds_the_point(tmp_path):
    done = jax_run(tmp_path=tmp_path, code="""
        import json, keras
        from memfit.estimate.xla import XlaEstimator
        model = keras.Sequential([keras.Input((512,)), keras.layers.Dense(1024),
                                  keras.layers.Dense(10)])
        est = XlaEstimator(model, optimizer="adam")
        out = {}
        for b in (8, 64, 512):
            s = est.step(b)
            e = est.at(b, budget="512MiB")
            out[b] = {"step": s.to_json(), "weights": e.weights, "slots": e.optimizer_slots,
                      "input": e.input_batch, "low": e.total_low, "point": e.total,
                      "high": e.total_high, "model_bytes": e.model_bytes,
                      "exact": est.exact(b), "max": e.max_batch_size, "verdict": e.verdict}
        best = est.max_batch_size("512MiB")
        out["edge"] = [est.high(best), est.high(best + 1)]
        named = XlaEstimator("models:named", optimizer="sgd").at(4)   # dicts in and out
        out["named"] = [named.input_batch, named.params_trainable]
        print(json.dumps(out))
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(done.stdout.strip().splitlines()[-1])
    params = 512 * 1024 + 1024 + 1024 * 10 + 10
    for b in ("8", "64", "512"):
        c = r[b]
        assert c["weights"] == 4 * params
        assert c["slots"] >= 2 * c["weights"]                     # Adam: two slots a weight
        assert c["input"] == int(b) * (512 + 10) * 4
        # XLA's arguments hold the state and the batch; the donated state is aliased.
        assert c["step"]["arguments"] >= c["weights"] + c["slots"] + c["input"]
        assert c["step"]["aliased"] >= c["weights"] + c["slots"]
        assert c["model_bytes"] >= c["exact"]
        assert c["low"] <= c["point"] <= c["high"]
        assert c["verdict"] == "fits"
    assert r["8"]["step"]["temporaries"] < r["512"]["step"]["temporaries"]
    assert r["edge"][0] <= 512 * 2**20 < r["edge"][1]             # max_batch_size's edge
    assert r["named"] == [4 * ((8 + 6 * 6 * 2) + (1 + 5)) * 4, 57 + 36 + 8 + 40]


def test_the_measuring_child_and_find_batch_size_run_on_jax(calibrated):
    done = jax_run(tmp_path=calibrated, timeout=600, code="""
        import json
        from memfit.estimate.measure import measure_training
        from memfit.estimate.search import find_batch_size
        r = measure_training("models:tiny", 16, steps=2)
        s = find_batch_size("models:tiny", "2GiB", max_trials=2, precision=0.5)
        print(json.dumps({"status": r.status, "measured": r.measured,
                          "backend": r.report.get("policy"), "trials": len(s.trials),
                          "fits": s.batch_size, "estimated": s.estimated,
                          "started": sorted({t.started for t in s.trials})}))
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(done.stdout.strip().splitlines()[-1])
    assert r["status"] == "ok" and r["measured"] > 0
    assert r["trials"] == 2 and r["fits"] > 0 and r["estimated"] > 0
    assert r["started"] == ["warm"]      # forked from a parent that imported JAX once


def test_a_budget_only_the_framework_fills_is_not_told_to_shrink_the_model(tmp_path):
    """A stranger's 251-parameter CNN at a budget inside the estimate's range was told
    "uncertain: run memfit find-batch-size" and then "nothing fits: use mixed precision, a
    lighter optimizer, or a smaller model": the framework and XLA's runtime are nearly all
    of it. The advice says what they need, and that real steps may still find a batch."""
    done = jax_run(tmp_path=tmp_path, code="""
        import json
        import models
        from memfit.estimate.xla import XlaEstimator
        est = XlaEstimator(models.tiny(), optimizer="adam")
        e = est.at(8)
        inside = (e.total_low + min(e.total_high, est.high(1))) // 2
        out = {"best": est.max_batch_size(inside),
               "inside": list(est.at(8, budget=inside).advice),
               "below": list(est.at(8, budget=est.baseline - 1).advice)}
        print(json.dumps(out))
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(done.stdout.strip().splitlines()[-1])
    assert r["best"] == 0
    assert r["inside"][0].startswith("not even batch size 1 fits for sure"), r
    assert any("memfit find-batch-size measures real steps" in a for a in r["inside"]), r
    assert not any("mixed precision" in a for a in r["inside"] + r["below"]), r
    assert r["below"] == [a for a in r["below"] if a.startswith("the framework alone")], r
    assert len(r["below"]) == 1 and "import jax, keras" in r["below"][0], r
