"""The classifier's panel: each scenario runs in its own child process (so one cannot
pollute another) under a MemoryMonitor, and must get the right verdict."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memfit.memory.log import read_log

PANEL = Path(__file__).parent / "panel"
linux = pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc")


def scenario(name, tmp_path, *args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(PANEL))
    out = subprocess.run([sys.executable, str(PANEL / f"{name}.py"), str(tmp_path / name), *args],
                         capture_output=True, text=True, timeout=600, env=env, cwd=PANEL)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["log"] = list(read_log(tmp_path / name / "memory.jsonl"))
    return result


@linux
def test_list_of_tuples_is_allocator_retention_and_trim_brings_it_down(tmp_path):
    plain = scenario("retention", tmp_path, "none")
    assert plain["verdict"] == "allocator-retention", plain
    assert plain["released"] > 0.5 * plain["growth"] > 0
    trimmed = scenario("retention", tmp_path / "t", "epoch")
    assert trimmed["verdict"] == "stable", trimmed
    grown = trimmed["values"][-1] - trimmed["values"][0]
    assert grown < 0.1 * plain["growth"]                     # RSS came back down
    trims = [r for r in trimmed["log"] if r["event"] == "trim"]
    assert len(trims) == 7 and max(r["released"] for r in trims) > 20 * 2**20


@linux
@pytest.mark.parametrize("name", ["global_list", "models_in_loop", "retracing"])
def test_real_leaks_are_leaks(tmp_path, name):
    result = scenario(name, tmp_path)
    assert result["verdict"] == "leak", result
    assert result["slope"] > 2 * 2**20
    verdicts = [r for r in result["log"] if r["event"] == "verdict"]
    assert verdicts and verdicts[-1]["verdict"] == "leak" and "clear_session" in \
        verdicts[-1]["fix"] + verdicts[-1]["explanation"]


@linux
def test_warm_up_then_flat_is_not_a_leak(tmp_path):
    result = scenario("warmup", tmp_path)
    assert result["verdict"] == "warm-up", result


@linux
def test_steady_training_is_stable_and_logged(tmp_path):
    result = scenario("steady", tmp_path)
    assert result["verdict"] == "stable", result
    events = [r["event"] for r in result["log"]]
    assert events[0] == "start" and events.count("epoch_end") == 8
    assert events.count("batch") == 8 * (64 // 20)            # every 20 of 64 batches
    assert all("rss_anon" in r and "rss_file" in r for r in result["log"]
               if r["event"] in ("batch", "epoch_end"))


@linux
def test_fit_from_a_memfit_stream_with_a_new_pass_per_epoch_is_stable(tmp_path):
    result = scenario("stream_fit", tmp_path)
    assert result["arena_limit"] == max(2, os.cpu_count() or 1)
    assert result["verdict"] in ("stable", "warm-up"), result
    values = result["values"]
    assert values[-1] - values[1] < 16 * 2**20, values        # uncapped: +33 MiB, "leak"
