"""memfit.session in this process: what it refuses, and what it gives a fresh run."""

import pytest

import memfit
from memfit.env import SUPERVISOR_ENV
from memfit.supervise import CheckpointError, CheckpointStore, restart_protocol


def checkpoint_with_seed(workdir, seed):
    CheckpointStore(workdir / "checkpoints").write(
        {"epoch": 2, "step": 0, "seed": seed, "history": {"loss": [1.0, 0.5]}},
        lambda d: None)


def test_a_fresh_session_starts_at_zero_with_a_kept_seed(tmp_path):
    with memfit.session(tmp_path, seed=5, verbose=0) as s:
        assert (s.epoch, s.step, s.resumed, s.seed) == (0, 0, False, 5)
        assert s.history == {}
    with memfit.session(tmp_path / "b", verbose=0) as s:
        assert 0 <= s.seed < 2**31       # a new random seed, kept in its checkpoints


def test_a_session_takes_position_seed_and_history_from_the_checkpoint(tmp_path):
    checkpoint_with_seed(tmp_path, 11)
    with memfit.session(tmp_path, verbose=0) as s:
        assert (s.epoch, s.step, s.resumed, s.seed) == (2, 0, True, 11)
        assert s.history == {"loss": [1.0, 0.5]}
        with pytest.raises(ValueError, match="Received: epoch=3"):
            s.dataset("anywhere", 32, epoch=3)


def test_another_seed_for_the_same_workdir_is_refused(tmp_path, monkeypatch):
    checkpoint_with_seed(tmp_path, 11)
    with pytest.raises(CheckpointError, match="seed=11, not seed=12"):
        memfit.session(tmp_path, seed=12)
    monkeypatch.setenv(SUPERVISOR_ENV, "1")
    with pytest.raises(SystemExit) as e:         # under memfit run: exit 78, no restart
        memfit.session(tmp_path, seed=12)
    assert e.value.code == 78


@pytest.mark.parametrize("kwargs, message", [
    ({"seed": -1}, "Received: seed=-1"),
    ({"seed": "7"}, "Received: seed='7'"),
    ({"checkpoint_every": 0}, "Received: checkpoint_every=0"),
])
def test_bad_arguments(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        memfit.session(tmp_path, **kwargs)


def test_restart_requests_are_ignored_without_a_supervisor(tmp_path, capsys):
    with memfit.session(tmp_path, verbose=0) as s:
        restart_protocol.write_request(tmp_path, "manual")
        assert s.pending_restart() is None
        s.request_restart("leak")
        assert s.pending_restart() is None
    assert "no supervisor runs this process" in capsys.readouterr().err


def test_a_gpu_cap_handed_down_by_share_is_applied_by_the_session(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMFIT_GPU_MEMORY_LIMIT", "1GiB")
    with memfit.session(tmp_path, verbose=0) as s:
        assert s.device is not None and s.device.memory_limit == 2**30
        assert s.device.source == "environment"
        assert s.device.applied == bool(s.device.gpus)      # on the CPU: nothing to cap
    monkeypatch.delenv("MEMFIT_GPU_MEMORY_LIMIT")
    with memfit.session(tmp_path / "b", verbose=0) as s:
        assert s.device is None


def test_a_leak_verdict_asks_the_supervised_session_to_restart(tmp_path, monkeypatch):
    """MemoryMonitor(on_leak="restart") under memfit run hands the restart to the
    session (which checkpoints everything), instead of saving a bare .keras and exiting."""
    from memfit.memory.classifier import classify

    monkeypatch.setenv(SUPERVISOR_ENV, "1")
    with memfit.session(tmp_path, verbose=0) as s:
        monitor = memfit.MemoryMonitor(tmp_path, on_leak="restart", verbose=0)
        monitor.on_train_begin()
        monitor.verdict = classify([100e6 + 20e6 * i for i in range(8)], warmup_epochs=1)
        assert monitor.verdict.kind == "leak"
        monitor._act(epoch=7, first=True)               # returns: no exit here
        assert s.pending_restart() == "leak"
        monitor.on_train_end()
    assert not (tmp_path / "checkpoints" / "leak-restart.keras").exists()
    from memfit.memory.log import read_log

    assert any(r["event"] == "request" and r["reason"] == "leak"
               for r in read_log(tmp_path / "memory.jsonl"))
