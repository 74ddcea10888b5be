"""The allocator policy: the environment memfit gives its children, and the estimate's
choice of constants for it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from memfit.estimate import EstimateError, Estimator, measure_training
from memfit.estimate.band import BANDS
from memfit.estimate.fitted import FIT_TERMS, FITTED, predict_from_features
from memfit.estimate.measure import _child_env
from memfit.estimate.training import KERNELS, kernels_of
from memfit.memory.allocator import (
    ALLOCATOR_POLICIES,
    FIXED_MMAP_THRESHOLD,
    check_policy,
    fix_mmap_threshold,
    policy_env,
)

MODELS = Path(__file__).with_name("models.py")
TINY = f"{MODELS}:tiny"


def test_fixed_policy_sets_the_threshold_and_default_removes_it():
    assert policy_env("fixed") == {"MALLOC_MMAP_THRESHOLD_": str(FIXED_MMAP_THRESHOLD)}
    inherited = {"MALLOC_MMAP_THRESHOLD_": "999999", "PATH": "/bin"}
    assert policy_env("default", inherited) == {"PATH": "/bin"}
    assert inherited["MALLOC_MMAP_THRESHOLD_"] == "999999"          # a copy was changed
    assert _child_env("cpu", "fixed")["MALLOC_MMAP_THRESHOLD_"] == "131072"
    assert "MALLOC_MMAP_THRESHOLD_" not in _child_env("cpu", "default")
    assert _child_env("cpu")["CUDA_VISIBLE_DEVICES"] == "-1"


@pytest.mark.parametrize("bad", ["glibc", "", None])
def test_unknown_policy_is_a_clear_error_quoting_it(bad):
    with pytest.raises(ValueError, match=f"allocator={bad!r}"):
        check_policy(bad)
    with pytest.raises(EstimateError, match=f"allocator={bad!r}"):
        Estimator(TINY, allocator=bad)
    with pytest.raises(ValueError, match=f"allocator={bad!r}"):
        measure_training(TINY, 8, allocator=bad)


@pytest.mark.parametrize("bad", [0, 100, 1.5, "128KiB"])
def test_fix_mmap_threshold_rejects_bad_thresholds(bad):
    with pytest.raises(ValueError, match=f"threshold={bad!r}"):
        fix_mmap_threshold(bad)


def test_every_policy_has_fitted_constants_and_the_estimate_says_which():
    assert set(FITTED) == set(ALLOCATOR_POLICIES)
    for per_precision in FITTED.values():
        assert set(per_precision) == set(KERNELS)
        for constants in per_precision.values():
            assert set(constants) == {*FIT_TERMS, "margin"}
    fixed = Estimator(TINY, allocator="fixed").at(8)
    default = Estimator(TINY).at(8)                   # a plain process: the default
    assert (fixed.allocator_policy, default.allocator_policy) == ("fixed", "default")
    assert "allocator policy: fixed" in str(fixed)
    assert fixed.to_json()["allocator_policy"] == "fixed"
    for e in (fixed, default):
        assert e.model_bytes == sum(v for name, v in e.components()
                                    if not name.startswith("framework baseline"))


def test_prediction_from_features_matches_the_estimate():
    est = Estimator(TINY, allocator="fixed")
    for b in (1, 64, 4096):
        assert abs(predict_from_features(est.features(b), FITTED["fixed"][est.kernels])
                   - est.at(b).model_bytes) <= 4          # int rounding of the parts


def test_the_constants_and_range_follow_the_kernels_the_training_runs():
    # oneDNN's float32 and 16-bit kernels and TensorFlow's own keep different memory
    # beyond the tensors (docs/estimate.md, "oneDNN"): each has its constants and range.
    for onednn, policy, kernels in [(True, "float32", "onednn-float32"),
                                    (True, "mixed_float16", "onednn-16bit"),
                                    (False, "mixed_float16", "tensorflow")]:
        est = Estimator(TINY, allocator="fixed", dtype_policy=policy, onednn=onednn)
        assert est.kernels == kernels == kernels_of(policy, onednn)
        assert est.constants == FITTED["fixed"][kernels]
        assert est.band == BANDS["fixed"][kernels]
        e = est.at(64)
        assert abs(predict_from_features(est.features(64), FITTED["fixed"][kernels])
                   - e.model_bytes) <= 4
        assert e.kernels == kernels and e.to_json()["kernels"] == kernels
        assert "kernels: " in str(e)


def test_with_onednn_the_large_buffers_are_played_through_its_pool():
    # oneDNN's allocator serves buffers of 256 KiB or more from a pool that keeps the
    # pages it wrote; TensorFlow's own leaves them to glibc (mapped under `fixed`).
    wide = f"{MODELS}:wide"
    on = Estimator(wide, allocator="fixed", onednn=True).features(256)
    off = Estimator(wide, allocator="fixed", onednn=False).features(256)
    assert off["pool"] == 0 and off["mmap"] > 2 * 2**20
    assert on["mmap"] < off["mmap"] / 4            # only the buffers under 256 KiB
    assert on["pool"] >= on["peak"] - on["heap"] - on["mmap"] > 0
    assert on["peak"] == off["peak"]                # the same tensors, another allocator


def test_onednn_is_read_from_the_process_tensorflow_runs_in():
    code = ("from memfit.estimate.training import onednn_enabled; "
            "print(onednn_enabled())")
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": "0", "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.stdout.strip() == "False", out.stderr[-500:]



def test_the_measuring_child_runs_under_the_policy_asked_for():
    env_before = dict(os.environ)
    r = measure_training(TINY, 8, steps=2, allocator="fixed")
    assert r.status == "ok", r.message
    assert r.report["allocator"] == "fixed"
    assert len(r.report["step_peaks"]) == 2
    d = measure_training(TINY, 8, steps=1)             # like a plain process by default
    assert d.status == "ok" and d.report["allocator"] == "default"
    assert dict(os.environ) == env_before                  # the parent is left alone
