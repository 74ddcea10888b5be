"""Measuring children forked from a warm parent (memfit.estimate.measure.warm_children):
what they measure against a new interpreter, and the ways back to a cold start.
benchmarks/warm_children.py compares the two on the held-out models, several rounds."""

import os
import signal
import textwrap
from pathlib import Path

import psutil
import pytest

from memfit.estimate import find_batch_size
from memfit.estimate.measure import measure_training, warm_children
from memfit.estimate.model import EstimateError
from memfit.estimate.search import SearchResult, Trial

MODELS = Path(__file__).with_name("models.py")
TINY = f"{MODELS}:tiny"


def warm_parents() -> list[psutil.Process]:
    return [p for p in psutil.Process().children()
            if "memfit.memory.warm import serve" in " ".join(p.cmdline())]


def test_a_forked_child_measures_what_a_new_interpreter_measures_and_one_follows_a_dead_parent():
    with warm_children():
        warm = measure_training(TINY, 32, steps=2)
        [parent] = warm_parents()
        assert warm.started == "warm" and warm.fits, warm.message
        os.kill(parent.pid, signal.SIGKILL)          # killed (the OOM killer's choice?)
        parent.wait(timeout=30)
        cold = measure_training(TINY, 32, steps=2)   # the rest start cold
        assert cold.started == "cold" and cold.fits, cold.message
        assert warm_parents() == []
    # The same memory, both ways: the fork keeps the import's pages (counted in the
    # child's RSS, as a new interpreter's own import is) and its first op starts the
    # runtime after the fork. About 0.3 MiB apart on 281 MiB on the development machine.
    assert abs(warm.peak - cold.peak) < 0.02 * cold.peak, (warm, cold)
    assert abs(warm.baseline - cold.baseline) < 0.02 * cold.baseline, (warm, cold)
    assert abs(warm.measured - cold.measured) < max(0.1 * cold.measured, 2 * 2**20), (warm, cold)
    with warm_children(False), warm_children():       # off inside on: still off
        assert measure_training(TINY, 8, steps=1).started == "cold"


def test_a_model_that_sets_a_variable_read_at_import_is_measured_in_a_new_interpreter(
        tmp_path):
    model = tmp_path / "sets_env.py"
    model.write_text(textwrap.dedent("""
        import os
        os.environ["TF_MEMFIT_TEST_SETTING"] = "1"     # read at import, for all we know
        import keras

        def make():
            return keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
    """))
    with warm_children():
        r = measure_training(f"{model}:make", 8, steps=1)
        assert r.fits and r.started == "cold", r.message
        assert warm_parents() == []          # and the next ones start cold too
    # and it is said why, naming the model's file (not the measuring child's)
    assert r.cold_reason == ("sets_env.py sets TF_MEMFIT_TEST_SETTING='1' (the warm parent "
                             "imported the frameworks with None)"), r.cold_reason
    said = str(SearchResult(batch_size=8, peak=1, budget=2, estimated=8, smallest_failing=9,
                            trials=(Trial(8, "ok", 1, 1.0, r.started),),
                            cold_reason=r.cold_reason))
    assert f"1 trial (new interpreters: {r.cold_reason}); the estimate" in said


def test_warm_and_prove_take_true_or_false_only():
    for name in ("warm", "prove"):
        with pytest.raises(EstimateError, match=f"{name} must be True or False. "
                                                f"Received: {name}='no'"):
            find_batch_size(TINY, "1GiB", **{name: "no"})


def test_a_child_whose_environment_drops_a_variable_of_this_one_starts_cold(monkeypatch):
    # the default allocator policy removes MALLOC_MMAP_THRESHOLD_ (glibc reads it when a
    # process starts): a warm parent started from this environment would have kept it
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    with warm_children():
        r = measure_training(TINY, 8, steps=1, allocator="default")
        assert r.fits and r.started == "cold", r.message
        assert warm_parents() == []
        assert r.report["allocator"] == "default", r.report["allocator"]


def test_a_child_started_as_a_new_interpreter_dies_with_the_process_that_started_it():
    """A SIGKILL'd `find-batch-size --cold` (nothing of it runs to kill anything) left its
    measuring child to train on, held to the budget by nobody: the child now dies with its
    starter (memfit.lifeline), as a fork of a tied warm parent does."""
    import subprocess
    import sys
    import time

    code = textwrap.dedent(f"""
        from memfit.estimate.measure import measure_training
        measure_training({TINY!r}, 1, steps=10**6, timeout=3600)   # cold: no warm block
    """)
    requester = subprocess.Popen([sys.executable, "-c", code])
    try:
        child = None
        for _ in range(600):                       # up to 60 s for Python to start it
            found = [p for p in psutil.Process(requester.pid).children()
                     if "memfit.estimate.child" in " ".join(p.cmdline())]
            if found:
                child = found[0]
                break
            assert requester.poll() is None, "the requester ended before its child started"
            time.sleep(0.1)
        assert child is not None
        requester.kill()
        requester.wait()
        # Without the tie it trains a million steps: minutes, not seconds.
        gone, alive = psutil.wait_procs([child], timeout=20)
        assert alive == [], [p.cmdline()[:3] for p in alive]
    finally:
        if requester.poll() is None:
            requester.kill()
