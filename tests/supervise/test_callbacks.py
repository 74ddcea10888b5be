"""The other callbacks of fit across restarts: their state in the checkpoint, put back exactly.

End to end, tests/supervise/scripts/callbacks_train.py trains on noise with EarlyStopping,
ReduceLROnPlateau, two ModelCheckpoints, CSVLogger, TensorBoard, LearningRateScheduler,
TerminateOnNaN and a user callback with get_state/set_state. Uninterrupted it stops after
8 of 12 epochs; restarted every epoch, or killed inside an epoch, it must stop at the same
epoch with the same learning rates, weights, CSV file and callback end states.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

import memfit
from memfit.supervise import callback_state, fit_hooks
from memfit.supervise.restart_protocol import SessionConfigError

SCRIPT = Path(__file__).parent / "scripts" / "callbacks_train.py"


def command(data: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, str(SCRIPT), str(data), str(out), *extra]


def outcome(out: Path) -> dict:
    with np.load(out / "final.npz") as f:
        weights = [f[k] for k in f.files]
    return {"weights": weights, "history": json.loads((out / "history.json").read_text()),
            "summary": json.loads((out / "summary.json").read_text()),
            "csv": (out / "log.csv").read_text()}


def assert_same(got: dict, want: dict) -> None:
    for a, b in zip(got["weights"], want["weights"], strict=True):
        assert np.array_equal(a, b), float(np.abs(a - b).max())
    assert got["history"] == want["history"]
    assert got["summary"] == want["summary"]
    assert got["csv"] == want["csv"]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(640, 16)).astype("float32")
    y = rng.normal(size=(640, 1)).astype("float32")          # noise: validation stalls
    path = tmp_path_factory.mktemp("callbacks") / "data"
    memfit.pack({"x": x, "y": y}, path, shards=4, split={"train": 0.8, "val": 0.2},
                progress=False)
    return path


@pytest.fixture(scope="module")
def reference(data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    base = tmp_path_factory.mktemp("reference")
    subprocess.run(command(data, base / "out"), check=True,
                   env={**os.environ, "MEMFIT_WORKDIR": str(base / "wd")})
    ref = outcome(base / "out")
    history = ref["history"]
    # The story the test needs: stopped early, the rate lowered on the plateau.
    assert 3 < len(history["loss"]) < 12, len(history["loss"])
    assert ref["summary"]["stopped_epoch"] == len(history["loss"]) - 1
    assert len(set(history["learning_rate"])) >= 3, history["learning_rate"]
    assert ref["summary"]["counter"]["batches"] == 16 * len(history["loss"])
    return ref


def test_restart_every_epoch_keeps_every_callbacks_state(data, reference, tmp_path):
    result = memfit.run(command(data, tmp_path / "out"), workdir=tmp_path / "wd",
                        restart_every=1, out=False)
    epochs = len(reference["history"]["loss"])
    assert result.finished and result.exit_code == 0
    assert len(result.children) == epochs           # one process an epoch, no more
    assert_same(outcome(tmp_path / "out"), reference)


def test_a_kill_inside_an_epoch_resumes_every_callback_exactly(data, reference, tmp_path):
    """SIGKILL after step 23 (epoch 2, step 7; the checkpoint is at step 20): the resumed
    epoch's start and its skipped steps are not shown again to the callbacks whose state
    was restored (the counters of TensorBoard, ModelCheckpoint(save_freq=7), the user's
    callback), and CSVLogger appends to its file instead of truncating it. A callback
    without get_state/set_state is warned about once in the whole run."""
    out, env = tmp_path / "out", {**os.environ, "MEMFIT_WORKDIR": str(tmp_path / "wd")}
    args = command(data, out, "--checkpoint-every", "5", "--kill-at", "23", "--unknown")
    first = subprocess.run(args, env=env, capture_output=True, text=True)
    assert first.returncode == -9, first.stderr[-2000:]
    second = subprocess.run(args, env=env, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr[-2000:]
    assert_same(outcome(out), reference)
    warnings = [line for line in (first.stderr + second.stderr).splitlines()
                if line.startswith("memfit: warning:")]
    assert len(warnings) == 1, warnings
    assert "callback Unknown" in warnings[0] and "(changed during training: seen)" in \
        warnings[0] and "get_state() and set_state(state)" in warnings[0]


def _model() -> keras.Model:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def test_backup_and_restore_beside_a_session_is_refused_before_it_loads(tmp_path):
    x, y = np.zeros((8, 4), "float32"), np.zeros((8, 1), "float32")
    with memfit.session(tmp_path / "wd", seed=1, verbose=0) as s:
        model = _model()
        backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
        with pytest.raises(SessionConfigError, match="BackupAndRestore cannot run beside"):
            model.fit(x, y, epochs=1, callbacks=[s.callback, backup], verbose=0)
    assert not (tmp_path / "backup").exists()       # it never ran


def test_the_callback_list_is_found_from_set_model_and_its_hooks_wrap_every_callback():
    """The trick fit_hooks relies on: Keras's CallbackList calls set_model on each callback
    from its own method, and calls its hooks on the instance (so shadowing works)."""
    calls: list[str] = []

    class Owner(keras.callbacks.Callback):
        def set_model(self, model):
            super().set_model(model)
            found = fit_hooks.find_list(self)
            assert found is not None
            assert fit_hooks.install(found, self)
            assert not fit_hooks.install(found, self)       # once per list

        def before_train_begin(self, cbs):
            calls.append("before")

        def after_train_begin(self, cbs):
            calls.append("after")

        def after_train_batch_end(self, batch):
            calls.append(f"after-batch-{batch}")

        def after_epoch_end(self, epoch):
            calls.append(f"after-epoch-{epoch}")

        def replaying(self, hook):
            return hook == "batch_begin"

        def hidden(self, cb):
            return isinstance(cb, Later)

    class Later(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            calls.append("later-begin")

        def on_train_batch_begin(self, batch, logs=None):
            calls.append("later-batch-begin")        # hidden: never seen

        def on_train_batch_end(self, batch, logs=None):
            calls.append(f"later-batch-{batch}")

        def on_epoch_end(self, epoch, logs=None):
            calls.append(f"later-epoch-{epoch}")

    x, y = np.zeros((8, 4), "float32"), np.zeros((8, 1), "float32")
    _model().fit(x, y, batch_size=4, epochs=1, callbacks=[Owner(), Later()], verbose=0)
    assert calls == ["before", "later-begin", "after", "later-batch-0", "after-batch-0",
                     "later-batch-1", "after-batch-1", "later-epoch-0", "after-epoch-0"]


def test_known_callbacks_round_trip_through_json_and_arrays():
    model = _model()
    stop = keras.callbacks.EarlyStopping(patience=3, restore_best_weights=True)
    plateau = keras.callbacks.ReduceLROnPlateau(patience=1)
    ckpt = keras.callbacks.ModelCheckpoint("m.weights.h5", save_weights_only=True,
                                           save_freq=3)
    for cb in (stop, plateau, ckpt):
        cb.set_model(model)
        cb.on_train_begin()
    stop.wait, stop.best, stop.best_epoch = 2, float("inf"), 4
    stop.best_weights = [np.arange(4.0).reshape(4, 1), np.ones(1)]
    plateau.wait, plateau.cooldown_counter, plateau.best = 1, 2, np.float32(0.5)
    ckpt._batches_seen_since_last_saving, ckpt._last_batch_seen = 2, 9
    state, arrays, failed = callback_state.capture([stop, plateau, ckpt])
    assert failed == []
    assert sorted(state) == ["EarlyStopping#0", "ModelCheckpoint#0", "ReduceLROnPlateau#0"]
    text = json.dumps(state, allow_nan=False)        # strict JSON: inf encoded, arrays apart
    assert len(arrays) == 2
    fresh = [keras.callbacks.EarlyStopping(patience=3, restore_best_weights=True),
             keras.callbacks.ReduceLROnPlateau(patience=1),
             keras.callbacks.ModelCheckpoint("m.weights.h5", save_weights_only=True,
                                              save_freq=3)]
    for cb in fresh:
        cb.on_train_begin()
    assert callback_state.restore(fresh, json.loads(text), arrays) == []
    again, plat, mc = fresh
    assert (again.wait, again.best, again.best_epoch) == (2, float("inf"), 4)
    assert [w.tolist() for w in again.best_weights] == [[[0.0], [1.0], [2.0], [3.0]], [1.0]]
    assert (plat.wait, plat.cooldown_counter, plat.best) == (1, 2, 0.5)
    assert (mc._batches_seen_since_last_saving, mc._last_batch_seen) == (2, 9)


def test_mismatched_callbacks_and_bad_user_state_are_named_not_dropped():
    class Odd(keras.callbacks.Callback):
        def get_state(self):
            return {"handle": object()}

        def set_state(self, state):
            raise AssertionError("not called")

    state, _, failed = callback_state.capture([Odd()])
    assert state == {} and failed == ["Odd#0: a object cannot be saved (give JSON values "
                                      "or NumPy arrays)"]
    problems = callback_state.restore([keras.callbacks.ReduceLROnPlateau()],
                                      {"EarlyStopping#0": {"wait": 1}}, {})
    assert problems == [
        "ReduceLROnPlateau#0 has no state in the checkpoint and starts from scratch",
        "the checkpoint holds state for EarlyStopping#0, which this fit does not have; "
        "it is dropped"]


def test_csv_logger_is_cut_back_to_the_checkpoint_and_appends(tmp_path):
    path = tmp_path / "log.csv"
    path.write_text("epoch,loss\n0,1.0\n1,0.5\n")
    logger = keras.callbacks.CSVLogger(str(path))
    state, _, _ = callback_state.capture([logger])
    assert state == {"CSVLogger#0": {"size": len("epoch,loss\n0,1.0\n1,0.5\n")}}
    with open(path, "a") as f:
        f.write("2,0.25\n")                  # written after the checkpoint, then killed
    undo = callback_state.prepare_csv_loggers([logger], state)
    assert path.read_text() == "epoch,loss\n0,1.0\n1,0.5\n"
    assert logger.append is True and undo == [(logger, False)]


class _Killed(Exception):
    pass


def test_a_stop_inside_an_epoch_checkpointed_at_that_step_still_ends_the_epoch(tmp_path):
    """TerminateOnNaN stops at step 6 of epoch 0, a step checkpoint_every=3 also saves; the
    process dies before the epoch's end checkpoint. Uninterrupted, fit still validates and
    ends that epoch (history, CSVLogger row, every on_epoch_end); the resume must too,
    training no step again."""
    x = np.ones((32, 4), "float32")
    x[21] = np.nan                                   # batch 5 of 4 samples: a NaN loss
    y = np.zeros((32, 1), "float32")
    val = (np.ones((8, 4), "float32"), np.zeros((8, 1), "float32"))

    class Ends(keras.callbacks.Callback):
        def __init__(self, die: bool):
            super().__init__()
            self.die, self.logs = die, []

        def on_epoch_end(self, epoch, logs=None):
            if self.die:
                raise _Killed()                      # before the epoch's checkpoint
            self.logs.append((epoch, sorted(logs)))

    def fit(die: bool) -> tuple[keras.Model, Ends, dict]:
        ends = Ends(die)
        with memfit.session(tmp_path / "wd", seed=5, checkpoint_every=3, verbose=0) as s:
            model = _model()
            history = model.fit(x, y, batch_size=4, epochs=3, shuffle=False,
                                validation_data=val, verbose=0,
                                callbacks=[s.callback, keras.callbacks.TerminateOnNaN(),
                                           ends])
        return model, ends, history.history

    with pytest.raises(_Killed):
        fit(die=True)
    model, ends, history = fit(die=False)
    assert int(model.optimizer.iterations.numpy()) == 6          # no step trained again
    assert ends.logs == [(0, ["loss", "val_loss"])]
    assert len(history["loss"]) == 1 and np.isnan(history["loss"][0])


def test_an_appending_csv_logger_killed_before_the_first_checkpoint_repeats_no_row(tmp_path):
    """CSVLogger(append=True) keeps the rows its file had before the run; a process that
    dies after writing epoch 0's row but before the first checkpoint must not leave that
    row to be written twice."""
    log = tmp_path / "log.csv"
    log.write_text("epoch,loss\n9,0.5\n")                   # an earlier run's row: kept
    x, y = np.ones((16, 4), "float32"), np.zeros((16, 1), "float32")

    class Dies(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise _Killed()                          # after CSVLogger, before the checkpoint

    def fit(*extra: keras.callbacks.Callback) -> None:
        with memfit.session(tmp_path / "wd", seed=5, verbose=0) as s:
            _model().fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[
                s.callback, keras.callbacks.CSVLogger(str(log), append=True), *extra])

    with pytest.raises(_Killed):
        fit(Dies())
    fit()
    assert [line.split(",")[0] for line in log.read_text().splitlines()] == \
        ["epoch", "9", "0", "1"]
    assert not (tmp_path / "wd" / "checkpoints" / callback_state.CSV_START).exists()


def test_a_tf_data_pipeline_that_reshuffles_each_epoch_is_warned_about_once(tmp_path,
                                                                             capsys):
    """A stranger's own `tf.data` pipeline with `.shuffle()` resumed with its first epoch's
    order again after each restart, and nothing was said: his restarted run trained 20
    epochs where the same run without a restart was stopped after 16."""
    import tensorflow as tf

    x, y = np.zeros((16, 4), "float32"), np.zeros((16, 1), "float32")
    plain = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    fixed = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(16, seed=1,
                                                               reshuffle_each_iteration=False)
    reshuffled = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(16).batch(8).map(
        lambda a, b: (a, b)).prefetch(1)
    packed = tmp_path / "packed"
    memfit.pack({"x": x, "y": y}, packed, progress=False)
    cases = (("plain", plain, "a", 1), ("fixed", fixed.batch(8), "b", 1),
             ("memfit's", memfit.dataset(packed, 8, features=("x", "y")), "c", 1),
             ("reshuffled", reshuffled, "d", 1),
             ("reshuffled, resumed", reshuffled, "d", 2))     # its checkpoint knows
    for name, data, workdir, epochs in cases:
        with memfit.session(tmp_path / workdir, seed=1, verbose=0) as s:
            _model().fit(data, epochs=epochs, callbacks=[s.callback], verbose=0)
        warned = [line for line in capsys.readouterr().err.splitlines()
                  if line.startswith("memfit: warning: fit reads a tf.data pipeline")]
        assert len(warned) == (name == "reshuffled"), (name, warned)
        if warned:
            assert "s.dataset(...)" in warned[0] and "reshuffle_each_iteration=False" in \
                warned[0]


def test_an_initial_epoch_other_than_the_sessions_is_refused(tmp_path):
    """A stranger's fit(initial_epoch=2) read data epoch 0 at fit's epoch 2 and, after a
    restart, data epoch 5 at fit's epoch 5: another order, silently."""
    x, y = np.zeros((8, 4), "float32"), np.zeros((8, 1), "float32")
    with memfit.session(tmp_path / "wd", seed=1, verbose=0) as s:
        with pytest.raises(SessionConfigError, match=r"fit\(initial_epoch=2\) beside "
                                                     r"memfit.session\(\).*initial_epoch=s.epoch"):
            _model().fit(x, y, epochs=4, initial_epoch=2, callbacks=[s.callback], verbose=0)
    with memfit.session(tmp_path / "wd2", seed=1, verbose=0) as s:     # s.epoch: accepted
        _model().fit(x, y, epochs=2, initial_epoch=s.epoch, callbacks=[s.callback], verbose=0)
    with memfit.session(tmp_path / "wd2", seed=1, verbose=0) as s:
        assert s.epoch == 2
        _model().fit(x, y, epochs=3, initial_epoch=s.epoch, callbacks=[s.callback], verbose=0)


def test_a_run_with_nothing_left_to_train_says_so_instead_of_resuming(tmp_path, capsys):
    """A stranger's second `memfit watch` of a session script (watch gives the script its
    workdir) printed "resuming from ..." and trained nothing: its run had finished."""
    x, y = np.zeros((8, 4), "float32"), np.ones((8, 1), "float32")

    def fit(workdir: str, epochs: int, *extra: keras.callbacks.Callback) -> str:
        with memfit.session(tmp_path / workdir, seed=1) as s:
            _model().fit(x, y, epochs=epochs, callbacks=[s.callback, *extra], verbose=0)
        return capsys.readouterr().err

    fit("done", 2)
    again = fit("done", 2)
    assert "memfit: the run in" in again and "already finished its 2 epochs" in again
    assert "nothing is left to train" in again and "resuming" not in again
    assert "memfit: resuming from" in fit("done", 3)     # more epochs asked: it goes on
    stop = keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=1e9)
    fit("stopped", 5, stop)
    again = fit("stopped", 5, stop)
    assert "was stopped by a callback after epoch 2" in again
    assert "nothing is left to train" in again


def test_a_resume_on_another_backend_is_said_to_be_inexact(tmp_path, monkeypatch, capsys):
    """A stranger's JAX run, resumed on TensorFlow, went on without a word and ended on
    weights that matched neither backend's uninterrupted run."""
    import memfit.supervise.callback as callback
    from memfit.supervise.snapshot import fingerprint

    x, y = np.zeros((8, 4), "float32"), np.zeros((8, 1), "float32")
    monkeypatch.setattr(callback, "fingerprint", lambda m: {**fingerprint(m), "backend": "jax"})
    with memfit.session(tmp_path / "wd", seed=1, verbose=0) as s:       # "written on JAX"
        _model().fit(x, y, epochs=1, callbacks=[s.callback], verbose=0)
    monkeypatch.undo()
    capsys.readouterr()
    seen = []
    for epochs in (2, 3):                  # said once a run: its checkpoints know
        with memfit.session(tmp_path / "wd", seed=1, verbose=0) as s:
            _model().fit(x, y, epochs=epochs, callbacks=[s.callback], verbose=0)
        said = [line for line in capsys.readouterr().err.splitlines()
                if line.startswith("memfit: warning:") and "backend" in line]
        assert len(said) == (epochs == 2), said
        seen += said
    assert "written on Keras's jax backend and this process runs on tensorflow" in seen[0]
    assert "KERAS_BACKEND=jax to resume exactly" in seen[0]
