"""The state of the other callbacks of ``fit``, saved in a checkpoint and put back on resume.

A restarted process builds its callbacks anew: ``EarlyStopping``'s patience counter,
``ReduceLROnPlateau``'s best value and cooldown, ``ModelCheckpoint``'s best value start
from scratch, and a training that stopped after 8 epochs uninterrupted runs all 12 under
``memfit run --restart-every 1``. This module reads what each callback carries from one
epoch to the next (:func:`capture`) and writes it back (:func:`restore`):

- Keras's stateful callbacks, by what each keeps: ``EarlyStopping`` (``wait``,
  ``best``, ``best_epoch``, ``stopped_epoch``, ``best_weights``), ``ReduceLROnPlateau``
  (``wait``, ``cooldown_counter``, ``best``; the rate itself lives in the optimizer,
  which the checkpoint holds), ``ModelCheckpoint`` (``best``, the batches since its last
  save), ``TensorBoard`` (its global train and test step counters), ``CSVLogger`` (the
  file's length at the checkpoint: a resumed process cuts off rows written after it,
  then appends instead of truncating; :func:`start_csv_loggers` does the same
  before the first checkpoint). ``LearningRateScheduler`` and ``TerminateOnNaN``
  keep nothing of their own; they are known, so never warned about.
- Any callback with ``get_state()`` and ``set_state(state)`` (the protocol of Grain's
  iterators): ``get_state`` returns a dict of JSON values and NumPy arrays.
- Any other callback whose attributes change during training gets one warning naming it
  and them: its resume is inexact, and it is never silently dropped.

What crosses the disk is data: the JSON state goes into ``state.json``, NumPy arrays
(``best_weights``...) into ``arrays.npz`` under ``callback.KEY.N`` names, referenced
from the JSON as ``{"memfit.array": NAME}``.

Example:
    >>> import keras
    >>> stop = keras.callbacks.EarlyStopping(patience=3)
    >>> stop.on_train_begin()
    >>> stop.wait, stop.best = 2, 0.25
    >>> state, arrays, _ = capture([stop])
    >>> state
    {'EarlyStopping#0': {'wait': 2, 'stopped_epoch': 0, 'best': 0.25, 'best_epoch': 0, \
'best_weights': None}}
    >>> again = keras.callbacks.EarlyStopping(patience=3)
    >>> again.on_train_begin()
    >>> restore([again], state, arrays)
    []
    >>> again.wait, again.best
    (2, 0.25)
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import keras
import numpy as np

from memfit.atomic import write_text_atomic

__all__ = ["capture", "restore", "handled", "keys", "Watcher", "ARRAY_PREFIX",
           "prepare_csv_loggers", "start_csv_loggers", "CSV_START"]

ARRAY_PREFIX = "callback."
# In the checkpoint directory until its first checkpoint: the appending CSVLoggers' file
# sizes when the run first began (see start_csv_loggers).
CSV_START = "csvlogger-start.json"
_ARRAY = "memfit.array"
_FLOAT = "memfit.float"

# Attributes every callback has that are not its training state.
_NOT_STATE = frozenset({"model", "_model", "params", "validation_data"})


def _attrs(*names: str, later: tuple[str, ...] = ()
           ) -> tuple[Callable[[Any], dict], Callable[[Any, Mapping], None]]:
    """A getter and a setter of the named attributes (missing ones raise AttributeError:
    a Keras that renamed one is a callback memfit no longer knows). ``later``: attributes
    the callback makes only in a later hook (``None`` until then)."""

    def get(cb: Any) -> dict:
        return {**{name: getattr(cb, name) for name in names},
                **{name: getattr(cb, name, None) for name in later}}

    def put(cb: Any, state: Mapping) -> None:
        for name in names:
            getattr(cb, name)                       # still there in this Keras
        for name in (*names, *later):
            if state.get(name) is not None or name in names and name in state:
                setattr(cb, name, state[name])

    return get, put


def _csv_get(cb: Any) -> dict:
    path = cb.filename
    return {"size": os.path.getsize(path) if os.path.isfile(path) else None}


def _tensorboard_get(cb: Any) -> dict:
    return {"_global_train_batch": int(cb._global_train_batch),
            "_global_test_batch": int(cb._global_test_batch),
            "_previous_epoch_iterations": float(np.asarray(cb._previous_epoch_iterations))}


def _nothing(cb: Any) -> dict:
    return {}


def _ignore(cb: Any, state: Mapping) -> None:
    return None


_es_get, _es_put = _attrs("wait", "stopped_epoch", "best", "best_epoch", "best_weights")
_tb_get, _tb_put = _attrs("_global_train_batch", "_global_test_batch",
                          "_previous_epoch_iterations")

# Keras's stateful callbacks: class -> (what to save, how to put it back). Subclasses
# first: a subclass is saved as its nearest known base.
_KNOWN: list[tuple[type, Callable[[Any], dict], Callable[[Any, Mapping], None]]] = [
    (keras.callbacks.EarlyStopping, _es_get, _es_put),
    (keras.callbacks.ReduceLROnPlateau, *_attrs("wait", "cooldown_counter", "best")),
    (keras.callbacks.ModelCheckpoint,
     *_attrs("best", "_batches_seen_since_last_saving", "_last_batch_seen",
             later=("_current_epoch",))),
    (keras.callbacks.TensorBoard, _tensorboard_get, _tb_put),
    (keras.callbacks.CSVLogger, _csv_get, _ignore),       # put back before it opens
    (keras.callbacks.LearningRateScheduler, _nothing, _ignore),
    (keras.callbacks.TerminateOnNaN, _nothing, _ignore),
]

# Callbacks that keep nothing a resume needs: the progress bar, fit's History (the
# session keeps the history), functions given to LambdaCallback.
_STATELESS: tuple[type, ...] = (keras.callbacks.ProgbarLogger, keras.callbacks.History,
                                keras.callbacks.LambdaCallback, keras.callbacks.RemoteMonitor)


def _protocol(cb: Any) -> bool:
    return callable(getattr(cb, "get_state", None)) and \
        callable(getattr(cb, "set_state", None))


def _known(cb: Any) -> tuple[Callable, Callable] | None:
    for kind, get, put in _KNOWN:
        if isinstance(cb, kind):
            return get, put
    return None


def _memfit_own(cb: Any) -> bool:
    return type(cb).__module__.split(".")[0] == "memfit"


def handled(cb: Any) -> bool:
    """Whether memfit saves and restores ``cb``'s state (a known Keras callback or one
    with ``get_state``/``set_state``): such a callback must not see a resumed epoch's
    repeated start or its skipped steps, which its saved state already holds."""
    return not _memfit_own(cb) and (_protocol(cb) or _known(cb) is not None)


def keys(callbacks: Iterable[Any]) -> dict[str, Any]:
    """The callbacks whose state is saved, by a key that stays the same in the next
    process: ``CLASS#N``, the Nth of that class in ``fit``'s list."""
    seen: dict[str, int] = {}
    out: dict[str, Any] = {}
    for cb in callbacks:
        if not handled(cb):
            continue
        name = type(cb).__name__
        out[f"{name}#{seen.get(name, 0)}"] = cb
        seen[name] = seen.get(name, 0) + 1
    return out


def _encode(value: Any, arrays: dict[str, np.ndarray], prefix: str) -> Any:
    if isinstance(value, np.ndarray) or (hasattr(value, "numpy") and hasattr(value, "shape")
                                         and not isinstance(value, np.generic)):
        name = f"{prefix}.{len(arrays)}"
        arrays[name] = np.asarray(value)
        return {_ARRAY: name}
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool) or value is None or isinstance(value, str | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {_FLOAT: repr(value)}
    if isinstance(value, list | tuple):
        return [_encode(v, arrays, prefix) for v in value]
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return {k: _encode(v, arrays, prefix) for k, v in value.items()}
    raise TypeError(f"a {type(value).__name__} cannot be saved (give JSON values or NumPy "
                    f"arrays)")


def _decode(value: Any, arrays: Mapping[str, np.ndarray]) -> Any:
    if isinstance(value, list):
        return [_decode(v, arrays) for v in value]
    if isinstance(value, Mapping):
        if set(value) == {_ARRAY}:
            return np.array(arrays[value[_ARRAY]])
        if set(value) == {_FLOAT}:
            return float(value[_FLOAT])
        return {k: _decode(v, arrays) for k, v in value.items()}
    return value


def capture(callbacks: Sequence[Any]) -> tuple[dict[str, Any], dict[str, np.ndarray],
                                               list[str]]:
    """The state of every callback memfit knows how to save.

    Args:
        callbacks: ``fit``'s callbacks, in order.

    Returns:
        ``(state, arrays, failed)``: the JSON state by :func:`keys`, the NumPy arrays it
        refers to, and the keys whose state could not be read or encoded, each with the
        reason (``"KEY: reason"``), for a warning.
    """
    state: dict[str, Any] = {}
    arrays: dict[str, np.ndarray] = {}
    failed: list[str] = []
    for key, cb in keys(callbacks).items():
        try:
            if _protocol(cb):
                raw = cb.get_state()
                if not isinstance(raw, Mapping):
                    raise TypeError(f"get_state() returned a {type(raw).__name__}, not a dict")
            else:
                raw = _known(cb)[0](cb)
            own: dict[str, np.ndarray] = {}
            state[key] = _encode(dict(raw), own, f"{ARRAY_PREFIX}{key}")
            arrays.update(own)
        except (AttributeError, TypeError, ValueError) as e:
            failed.append(f"{key}: {e}")
    return state, arrays, failed


def restore(callbacks: Sequence[Any], state: Mapping[str, Any],
            arrays: Mapping[str, np.ndarray]) -> list[str]:
    """Puts a checkpoint's callback state back (after each callback's ``on_train_begin``,
    which resets it).

    Args:
        callbacks: this ``fit``'s callbacks.
        state: the checkpoint's callback state (:func:`capture`'s first value).
        arrays: the checkpoint's arrays.

    Returns:
        One line for each callback whose state did not go back as saved (a callback with
        no saved state, a saved state with no callback, a state that failed to load).
    """
    problems: list[str] = []
    now = keys(callbacks)
    for key, cb in now.items():
        if key not in state:
            problems.append(f"{key} has no state in the checkpoint and starts from scratch")
            continue
        try:
            value = _decode(state[key], arrays)
            if _protocol(cb):
                cb.set_state(value)
            else:
                _known(cb)[1](cb, value)
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            problems.append(f"{key}'s saved state could not be put back ({e})")
    for key in state:
        if key not in now:
            problems.append(f"the checkpoint holds state for {key}, which this fit does "
                            f"not have; it is dropped")
    return problems


def prepare_csv_loggers(callbacks: Sequence[Any], state: Mapping[str, Any]) -> list:
    """Before ``fit``'s callbacks start, on a resume: each ``CSVLogger``'s file is cut
    back to its length at the checkpoint (rows of epochs trained after it are dropped,
    to be written again) and the logger is set to append instead of truncating.

    Returns:
        ``(logger, its own append setting)`` pairs, to be put back after it opened.
    """
    undo = []
    for key, cb in keys(callbacks).items():
        if not isinstance(cb, keras.callbacks.CSVLogger) or _protocol(cb):
            continue
        size = (state.get(key) or {}).get("size")
        if size is not None and os.path.isfile(cb.filename) and \
                os.path.getsize(cb.filename) > size:
            os.truncate(cb.filename, size)
        undo.append((cb, cb.append))
        cb.append = True
    return undo


def start_csv_loggers(callbacks: Sequence[Any], path: str | os.PathLike) -> None:
    """Before ``fit``'s callbacks start, when there is no checkpoint yet: a ``CSVLogger``
    with ``append=True`` keeps its file's rows from before the run, but the rows a
    process killed before the first checkpoint wrote are cut off (written again by the
    next one). At the run's first start each such file's size is recorded in ``path``
    (the session removes it with its first checkpoint, which records the sizes from then
    on); at a start that finds ``path``, each file is cut back to that size."""
    loggers = {key: cb for key, cb in keys(callbacks).items()
               if isinstance(cb, keras.callbacks.CSVLogger) and not _protocol(cb)
               and cb.append}
    if not loggers:
        return
    try:
        start = json.loads(open(path, encoding="utf-8").read())
    except (FileNotFoundError, ValueError):
        start = None
    if not isinstance(start, dict):
        sizes = {key: {"file": os.path.abspath(cb.filename),
                       "size": os.path.getsize(cb.filename) if os.path.isfile(cb.filename)
                       else 0} for key, cb in loggers.items()}
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        write_text_atomic(path, json.dumps(sizes))
        return
    for key, cb in loggers.items():
        saved = start.get(key)
        if isinstance(saved, dict) and saved.get("file") == os.path.abspath(cb.filename) \
                and isinstance(saved.get("size"), int) and os.path.isfile(cb.filename) \
                and os.path.getsize(cb.filename) > saved["size"]:
            os.truncate(cb.filename, saved["size"])


def _token(value: Any) -> Any:
    """What :class:`Watcher` compares: a plain value itself, anything else its identity."""
    if isinstance(value, float):
        return ("float", repr(value))           # NaN == NaN here
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, tuple):
        return tuple(_token(v) for v in value)
    return ("id", id(value))


class Watcher:
    """Notices the callbacks whose state memfit cannot save: neither known nor with
    ``get_state``/``set_state``, yet their attributes change during training.

    Example:
        >>> class Counter(keras.callbacks.Callback):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.count = 0
        >>> Counter.__module__ = "train"      # a user's script (not memfit's own code)
        >>> counter = Counter()
        >>> watcher = Watcher([counter])
        >>> counter.count += 1
        >>> watcher.changed()
        [('Counter', ['count'])]
    """

    def __init__(self, callbacks: Iterable[Any]):
        self._before = {id(cb): (cb, self._snapshot(cb)) for cb in callbacks
                        if not handled(cb) and not _memfit_own(cb)
                        and not isinstance(cb, _STATELESS)}

    @staticmethod
    def _snapshot(cb: Any) -> dict[str, Any]:
        return {k: _token(v) for k, v in vars(cb).items() if k not in _NOT_STATE}

    def changed(self) -> list[tuple[str, list[str]]]:
        """``(class name, [attribute, ...])`` for each watched callback whose attributes
        changed since it was made."""
        out = []
        for cb, before in self._before.values():
            now = self._snapshot(cb)
            names = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
            if names:
                out.append((type(cb).__name__, names))
        return out
