"""The rules on synthetic measurements: the GPU rule (no GPU here), thresholds, ranking."""

import copy
import json

from memfit.doctor.data_rules import BUFFER_MIN, DATA_MIN
from memfit.doctor.facts import PROBE_FORMAT, Facts, ProbeResults
from memfit.doctor.findings import diagnose
from memfit.doctor.growth_rules import WARMUP_MIN, memory_growth
from memfit.doctor.model_rules import gpu_no_limit
from memfit.doctor.report import DoctorResult

MiB, GiB = 2**20, 2**30

QUIET = {"steps": 100, "fit": {"arrays": [], "pipeline": None, "batch_size": 32,
                               "steps_per_epoch": 100, "epochs": 10, "initial_epoch": 0},
         "arrays": {"total": 0, "mapped": 0, "largest": []}, "rss_before_fit": 300 * MiB,
         "rss_first_step": 310 * MiB, "rss_peak_steps": 320 * MiB, "verdict": None,
         "causes": {"models_alive": 1, "retraced": []}, "gpu": None, "estimate": None}

GPU = {"gpus": [{"name": "/physical_device:GPU:0", "growth": False, "memory_limit": None}],
       "devices": [{"index": 0, "name": "NVIDIA H200", "total": 140 * GiB, "used": 139 * GiB,
                    "own": 130 * GiB, "others": [{"pid": 4242, "used": 6 * GiB}]}],
       "own": 130 * GiB, "allocator": {"GPU:0": {"current": 2 * GiB, "peak": 3 * GiB}}}


def facts(**probe_changes):
    probe = copy.deepcopy(QUIET)
    probe.update(probe_changes)
    return Facts(command=("python", "train.py"), probe=ProbeResults.from_json(probe),
                 peak_anon=330 * MiB, ram_total=24 * GiB)


def test_the_probes_results_file_reads_and_writes_back_byte_for_byte():
    """The results file the probe writes (every key, in the probe's order) reads into
    ProbeResults and is written back the same, so files from older runs still read."""
    written = {"format": PROBE_FORMAT, "pid": 42, "argv": ["train.py"], "run": "r1",
               "steps": 100, "fits": 1, "stopped": "steps", "steps_limit": 100,
               "seconds_limit": None, "duration": 3.5, "train_seconds": 2.0,
               "rss_before_fit": 300 * MiB, "rss_first_step": 310 * MiB,
               "rss_final": 315 * MiB, "rss_peak_steps": 320 * MiB,
               "step_rss": [310 * MiB, 320 * MiB], "epoch_rss": [320 * MiB],
               "fit": QUIET["fit"], "arrays": QUIET["arrays"], "epochs": 1,
               "epochs_limit": None, "releases": [{"released": 0, "kept": 1, "before": 2}],
               "verdict": None, "causes": QUIET["causes"], "kept": {"error": "ValueError: x"},
               "gpu": None, "model_file": None, "estimate": None}
    probe = ProbeResults.from_json(json.loads(json.dumps(written)))
    assert probe.steps == 100 and probe.step_rss == (310 * MiB, 320 * MiB)
    assert json.dumps(probe.to_json()) == json.dumps(written)
    assert ProbeResults.from_json({"format": PROBE_FORMAT, "new_key": 1}).steps == 0


def test_quiet_run_has_no_findings():
    assert diagnose(facts()) == []


def test_gpu_without_growth_shared_with_others_is_a_finding():
    (f,) = diagnose(facts(gpu=GPU))
    assert f.kind == "gpu-no-limit"
    assert f.bytes == 127 * GiB                       # held beyond the allocator's peak
    assert "pid 4242" in f.measured and "130.0 GiB" in f.measured
    assert f.fix[0].startswith("memfit.configure_device(growth=True)")
    assert any("TF_FORCE_GPU_ALLOW_GROWTH=true python train.py" in line for line in f.fix)


def test_gpu_rule_is_silent_with_growth_a_cap_no_neighbour_or_no_gpu():
    grown = copy.deepcopy(GPU)
    grown["gpus"][0]["growth"] = True
    capped = copy.deepcopy(GPU)
    capped["gpus"][0]["memory_limit"] = 8 * GiB
    alone = copy.deepcopy(GPU)
    alone["devices"][0]["others"] = []
    for gpu in (grown, capped, alone, None):
        assert gpu_no_limit(facts(gpu=gpu)) is None
    no_nvml = copy.deepcopy(GPU)
    no_nvml["devices"] = None                      # NVML missing: cannot tell who shares
    assert gpu_no_limit(facts(gpu=no_nvml)) is None


def verdict(kind, growth, released=None):
    return {"verdict": kind, "growth": growth, "slope": growth / 8, "epochs": 10,
            "released": released, "basis": "steps", "steps_per_value": 10,
            "per_step": growth / 80}


def test_retention_is_a_finding_with_the_trim_fix():
    f = memory_growth(facts(verdict=verdict("allocator-retention", 300 * MiB, 280 * MiB)))
    assert f.title.startswith("Freed memory stays with the allocator")
    assert 'trim="epoch"' in f.fix[0]


def test_small_warm_up_and_stable_are_not_findings():
    assert memory_growth(facts(verdict=verdict("warm-up", 50 * MiB))) is None
    assert memory_growth(facts(verdict=verdict("stable", 1 * MiB))) is None
    big = memory_growth(facts(verdict=verdict("warm-up", WARMUP_MIN + 200 * MiB)))
    assert big is not None and "warm-up" in big.title


def test_leak_is_projected_over_the_planned_steps_and_names_causes():
    f = memory_growth(facts(verdict=verdict("leak", 80 * MiB),
                            causes={"models_alive": 12,
                                    "retraced": [{"name": "step", "traces": 40}]}))
    assert f.bytes == 1000 * MiB                       # 1 MiB a step × 10 epochs × 100 steps
    assert "12 Keras models are alive" in f.measured
    assert "'step' was traced 40 times" in f.measured


def test_a_leak_on_jax_is_not_told_to_fix_a_tf_function():
    on_tf = memory_growth(facts(verdict=verdict("leak", 80 * MiB)))
    assert any("@tf.function" in line for line in on_tf.fix)
    jax_fit = {**QUIET["fit"], "backend": "jax"}
    on_jax = memory_growth(facts(verdict=verdict("leak", 80 * MiB), fit=jax_fit))
    assert not any("tf.function" in line for line in on_jax.fix), on_jax.fix
    assert any("clear_session" in line for line in on_jax.fix)


def test_without_probe_the_outside_verdict_is_used_and_a_short_probe_gives_none():
    outside = Facts(command=("python", "t.py"), probe=None, peak_anon=GiB,
                    watch_verdict={"verdict": "leak", "growth": 500 * MiB, "slope": 50 * MiB,
                                   "epochs": 10, "basis": "time slices"}, ram_total=24 * GiB)
    assert memory_growth(outside).details["basis"] == "time slices"
    short = Facts(command=("python", "t.py"), probe=ProbeResults.from_json(QUIET),
                  peak_anon=GiB,
                  watch_verdict=outside.watch_verdict, ram_total=24 * GiB)
    assert memory_growth(short) is None


def test_findings_are_ranked_by_memory_at_stake():
    fit = copy.deepcopy(QUIET["fit"])
    fit["arrays"] = [{"shape": [1000, 100000], "dtype": "float32", "nbytes": 2 * DATA_MIN,
                      "mapped": False, "names": ["x"]}]
    fit["pipeline"] = {"buffers": [{"kind": "prefetch", "buffer_size": 64, "elements": 64,
                                    "element_bytes": 4 * MiB, "bytes": 256 * MiB,
                                    "element": "float32 (256, 4096)"}], "tensors_bytes": 0}
    found = diagnose(facts(fit=fit, gpu=GPU))
    assert [f.kind for f in found] == ["gpu-no-limit", "pipeline-buffers", "data-in-ram"]
    assert found[1].details["buffers"][0]["bytes"] >= BUFFER_MIN
    text = str(DoctorResult(command=("python", "train.py"), exit_code=0, duration=1.0,
                            findings=tuple(found), steps=100, stopped="steps", probe=True))
    assert text.index("1. The GPU") < text.index("2. Input") < text.index("3. The training")


def test_mapped_arrays_are_not_data_in_ram():
    fit = copy.deepcopy(QUIET["fit"])
    fit["arrays"] = [{"shape": [1000, 100000], "dtype": "float32", "nbytes": 4 * DATA_MIN,
                      "mapped": True, "names": ["x"]}]
    assert diagnose(facts(fit=fit)) == []


def test_the_restart_fix_asks_for_a_session_rather_than_saying_the_script_has_one():
    """A stranger's plain script (no memfit.session()) was told that "the script uses
    memfit.session()" in the `memfit run` line of a finding: the doctor does not know
    that, so the line says what the resume needs."""
    leak = memory_growth(facts(verdict=verdict("leak", 80 * MiB)))
    kept = diagnose(facts(kept={"released": 200 * MiB, "kept": 400 * MiB,
                                "before": 450 * MiB}))
    lines = [line for f in (leak, *kept) for line in f.fix if "memfit run" in line]
    assert len(lines) == 2, lines
    for line in lines:
        assert "with memfit.session() in the script" in line
        assert "the script uses memfit.session()" not in line
