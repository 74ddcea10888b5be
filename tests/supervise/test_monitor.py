import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

import memfit
from memfit import exitcodes
from memfit.errors import MemfitError
from memfit.memory.log import LogError, MemoryLog, read_log


def tiny_model():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    return model


def test_fit_writes_the_shared_log_and_tensorboard_scalars(tmp_path):
    x, y = np.ones((64, 4), np.float32), np.ones(64, np.float32)
    monitor = memfit.MemoryMonitor(tmp_path / "wd", every_n_batches=2, verbose=0,
                                   tensorboard_dir=str(tmp_path / "tb"), trim="epoch",
                                   report=True)
    tiny_model().fit(x, y, batch_size=16, epochs=5, callbacks=[monitor], verbose=0)
    records = list(read_log(tmp_path / "wd" / "memory.jsonl"))
    events = [r["event"] for r in records]
    assert events[0] == "start" and records[0]["source"] == "monitor"
    assert events.count("epoch_end") == 5 and events.count("batch") == 10
    assert events.count("trim") == 5
    assert monitor.verdict is not None and monitor.verdict.kind in ("stable", "warm-up")
    assert list(monitor.epoch_values) == [r["rss_anon"] for r in records
                                          if r["event"] == "epoch_end"]
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(tmp_path / "tb"))
    html = (tmp_path / "wd" / "report.html").read_text()
    assert "data:image/png;base64," in html and monitor.verdict.kind in html
    assert (tmp_path / "wd" / "timeline.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("kwargs,message", [
    ({"every_n_batches": -1}, "every_n_batches=-1"),
    ({"warmup_epochs": "2"}, "warmup_epochs='2'"),
    ({"trim": "batch"}, "trim='batch'"),
    ({"on_leak": "panic"}, "on_leak='panic'"),
    ({"budget": "lots"}, "budget='lots'"),
])
def test_bad_arguments_quote_the_value(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        memfit.MemoryMonitor(tmp_path, **kwargs)


def test_unwritable_workdir_fails_before_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(MemfitError, match="is a file"):
        memfit.MemoryMonitor(blocker)
    with pytest.raises(MemfitError, match="Cannot create the workdir"):
        memfit.MemoryMonitor(blocker / "sub")


def test_workdir_defaults_to_the_supervisors(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMFIT_WORKDIR", str(tmp_path / "from-env"))
    assert memfit.MemoryMonitor(verbose=0).workdir.path == tmp_path / "from-env"


def _leaky_epochs(monitor, model=None, epochs=8):
    kept = []
    monitor.set_model(model) if model is not None else None
    monitor.on_train_begin()
    for epoch in range(epochs):
        kept.append(np.ones(24 * 2**20, np.uint8))            # a real leak: 24 MiB/epoch
        monitor.on_epoch_end(epoch)
        if model is not None and model.stop_training:
            return epoch
    return None


def test_on_leak_stop_stops_training(tmp_path):
    model = tiny_model()
    monitor = memfit.MemoryMonitor(tmp_path, on_leak="stop", verbose=0, budget="64GiB")
    stopped_at = _leaky_epochs(monitor, model)
    assert stopped_at == 4                                    # first epoch with a verdict
    assert monitor.verdict.kind == "leak" and monitor.verdict.epochs_to_budget > 100
    assert any(r["event"] == "stop" for r in read_log(tmp_path / "memory.jsonl"))


def test_on_leak_stop_says_it_stopped_the_training(tmp_path, capsys):
    """A stranger's training ended after 5 of 30 epochs with no word of why."""
    monitor = memfit.MemoryMonitor(tmp_path, on_leak="stop", budget="64GiB")
    assert _leaky_epochs(monitor, tiny_model()) == 4
    err = capsys.readouterr().err
    assert "memfit: stopping training after epoch 5: memory is leaking (on_leak='stop')" in err


def test_the_log_and_the_end_of_training_carry_the_final_verdict(tmp_path, capsys):
    """A verdict is logged when its kind changes; the report read "stable ... over 5
    epochs" of a 20-epoch training, and the end of training printed only the paths."""
    monitor = memfit.MemoryMonitor(tmp_path, warmup_epochs=1)
    tiny_model().fit(np.ones((64, 4)), np.ones(64), batch_size=16, epochs=12, verbose=0,
                     callbacks=[monitor])
    final = monitor.verdict
    assert final.epochs == 12 and final.kind != "too-short"
    logged = [r for r in read_log(tmp_path / "memory.jsonl") if r["event"] == "verdict"]
    assert logged[-1]["headline"] == final.headline
    assert len(logged) >= 2 and logged[0]["headline"] != final.headline  # said at first too
    assert f"memfit: {final.headline}\n  memory log: " in capsys.readouterr().err


def test_on_leak_restart_without_a_session_exits_with_the_restart_code(tmp_path):
    script = textwrap.dedent(f"""
        import numpy as np, keras, memfit
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        monitor = memfit.MemoryMonitor({str(tmp_path)!r}, on_leak="restart", verbose=0)
        monitor.set_model(model)
        monitor.on_train_begin()
        kept = []
        for epoch in range(8):
            kept.append(np.ones(24 * 2**20, np.uint8))
            monitor.on_epoch_end(epoch)
        """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert out.returncode == exitcodes.RESTART, out.stderr[-2000:]
    assert "no memfit.session" in out.stderr
    assert not (tmp_path / "checkpoints").exists()      # nothing written that nothing reads
    last = list(read_log(tmp_path / "memory.jsonl"))[-1]
    assert last["event"] == "exit" and last["code"] == exitcodes.RESTART


def test_a_workdir_holding_another_files_log_is_refused_when_the_monitor_is_made(tmp_path):
    """A stranger's training ran to its end on a workdir whose memory.jsonl was a CSV,
    then died in on_train_end, the code after fit never run."""
    (tmp_path / "memory.jsonl").write_text("a,b\n1,2\n")
    with pytest.raises(LogError, match="not a memfit log"):
        memfit.MemoryMonitor(tmp_path)
    assert (tmp_path / "memory.jsonl").read_text() == "a,b\n1,2\n"      # left as it was


def test_read_log_refuses_other_files(tmp_path):
    csv = tmp_path / "a.csv"
    csv.write_text("t,rss\n")
    with pytest.raises(LogError, match="not a memfit log"):
        list(read_log(csv))
    other = tmp_path / "b.jsonl"
    other.write_text(json.dumps({"t": 1, "pid": 1, "event": "x"}) + "\n")
    with pytest.raises(LogError, match="not a memfit log"):
        list(read_log(other))
    good = tmp_path / "c.jsonl"
    with MemoryLog(good, source="test") as log:
        log.write("sample", rss=1)
    with open(good, "a") as f:
        f.write('{"t": 2, "pid"')                              # a writer killed mid-line
    assert [r["event"] for r in read_log(good)] == ["start", "sample"]


def test_limit_arenas_only_lowers_and_rejects_bad_counts():
    from memfit.memory.allocator import limit_arenas

    first = limit_arenas(64)
    assert first is not None and first <= 64
    assert limit_arenas(first + 10) == first                 # never raised again
    with pytest.raises(ValueError, match="count=0"):
        limit_arenas(0)


def test_the_verdict_comes_after_the_epoch_it_judged(tmp_path, capsys, monkeypatch):
    """Keras runs a user's callbacks before its progress bar, so a verdict printed in
    on_epoch_end came above the epoch it judged, after a blank line (make demo: `Epoch
    10/10`, a blank line, `memfit: stable ...`, then `282/282 - 10s ...`). It now follows
    the epoch's line, at the next epoch's start or at the end of training."""
    monkeypatch.setattr(sys, "stderr", sys.stdout)       # one stream, in the order written
    monitor = memfit.MemoryMonitor(tmp_path, warmup_epochs=1)
    tiny_model().fit(np.ones((64, 4)), np.ones(64), batch_size=16, epochs=7, verbose=2,
                     callbacks=[monitor])
    lines = capsys.readouterr().out.splitlines()
    judged = [r["epoch"] for r in read_log(tmp_path / "memory.jsonl")
              if r["event"] == "verdict"]
    assert judged, lines
    for epoch in judged:
        at = lines.index(f"Epoch {epoch + 1}/7")
        assert lines[at + 1].startswith("4/4 - "), lines[at:at + 3]     # the epoch's line
        assert lines[at + 2].startswith("memfit: "), lines[at:at + 3]   # then the verdict
    assert "" not in lines[:lines.index("Epoch 7/7") + 2], lines
