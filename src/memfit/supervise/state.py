"""What a checkpoint holds besides its files: the one contract between the two processes.

The training process (:mod:`memfit.supervise.session`) writes a :class:`CheckpointState`
with every checkpoint; the supervisor (:mod:`memfit.supervise.supervisor`) reads it back to
tell why its child exited (``reason``) and whether that checkpoint is new (``time``).
Both go through this class, never through the keys of a dict. On disk it is the body
of ``state.json`` (:mod:`memfit.supervise.checkpoint` adds ``format``,
``format_version``, ``files`` and ``checksum`` around it); :meth:`CheckpointState.to_json`
and :meth:`CheckpointState.from_json` are the only code that knows its keys.

Example:
    >>> state = CheckpointState(epoch=2, step=17, seed=42, reason="steps")
    >>> state.position
    (2, 17)
    >>> CheckpointState.from_json(state.to_json()) == state
    True
    >>> CheckpointState.from_json({"epoch": "2"})
    Traceback (most recent call last):
    ...
    ValueError: epoch must be an integer >= 0, such as 3. Received: epoch='2'
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping
from typing import Any

from memfit import checks

__all__ = ["CheckpointState"]


@dataclasses.dataclass(frozen=True)
class CheckpointState:
    """The state saved with one checkpoint.

    Attributes:
        epoch: the epoch training resumes at.
        step: steps of ``epoch`` already trained (0 at an epoch boundary).
        seed: the run's seed (every resume uses it), or ``None``.
        reason: why it was written: ``"epoch"``, ``"steps"``, a restart's reason
            (``"every 1 epoch"``, ``"max-rss"``, ``"preempted (SIGTERM)"``...), or
            ``None``.
        history: per-epoch logs of every epoch so far (like ``History.history``).
        logs: the running means of a half-done epoch (shown for its skipped steps).
        rng: the process-wide RNG states (:func:`memfit.supervise.rng.capture`).
        epoch_rng: for a checkpoint inside an epoch, the same states when that epoch
            began (before its data order was drawn: ``fit`` on NumPy arrays with
            ``shuffle=True`` draws it from NumPy's global generator), or ``None``.
        fingerprint: what must match the model it is loaded into
            (:func:`memfit.supervise.snapshot.fingerprint`).
        callbacks: the other callbacks' state by ``CLASS#N``
            (:func:`memfit.supervise.callback_state.capture`; arrays in ``arrays.npz``),
            or ``None`` when none was saved.
        stopped: whether training had stopped (``EarlyStopping``, ``TerminateOnNaN``):
            a resume then trains no further.
        inexact: the callbacks already warned about whose state cannot be saved (the
            warning is given once a run, not once a process).
        time: when the store wrote it (Unix time; set by the store, ``None`` before).
    """

    epoch: int
    step: int = 0
    seed: int | None = None
    reason: str | None = None
    history: Mapping[str, list[float]] = dataclasses.field(default_factory=dict)
    logs: Mapping[str, float] = dataclasses.field(default_factory=dict)
    rng: Mapping[str, Any] | None = None
    epoch_rng: Mapping[str, Any] | None = None
    fingerprint: Mapping[str, Any] | None = None
    callbacks: Mapping[str, Any] | None = None
    stopped: bool = False
    inexact: tuple[str, ...] = ()
    time: float | None = None

    @property
    def position(self) -> tuple[int, int]:
        """``(epoch, step)``: where training resumes."""
        return self.epoch, self.step

    def to_json(self) -> dict[str, Any]:
        """The JSON object written in ``state.json`` (``None`` fields left out), in the
        key order memfit has always written."""
        data: dict[str, Any] = {"epoch": self.epoch, "step": self.step, "seed": self.seed,
                                "reason": self.reason,
                                "history": {k: list(v) for k, v in self.history.items()},
                                "logs": dict(self.logs), "rng": self.rng,
                                "epoch_rng": self.epoch_rng,
                                "fingerprint": self.fingerprint,
                                "callbacks": None if self.callbacks is None else
                                dict(self.callbacks),
                                "stopped": True if self.stopped else None,
                                "inexact": list(self.inexact) or None, "time": self.time}
        return {k: v for k, v in data.items() if v is not None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CheckpointState:
        """The state in a ``state.json`` object, checked field by field. Keys it does not
        know (the store's ``format``, ``files``, ``checksum``...) are passed over.

        Raises:
            ValueError: a field is missing or of the wrong type, quoting it.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"a checkpoint state must be a JSON object. Received: {data!r}")
        if "epoch" not in data:
            raise ValueError(f"a checkpoint state must hold its epoch. Received: "
                             f"{sorted(data)!r}")
        return cls(epoch=checks.count("epoch", data["epoch"], minimum=0),
                   step=checks.count("step", data.get("step", 0), minimum=0),
                   seed=checks.count("seed", data.get("seed"), minimum=0, optional=True),
                   reason=_text("reason", data.get("reason")),
                   history=_table("history", data.get("history", {}), _series),
                   logs=_table("logs", data.get("logs", {}), _number),
                   rng=_table("rng", data.get("rng"), None, optional=True),
                   epoch_rng=_table("epoch_rng", data.get("epoch_rng"), None, optional=True),
                   fingerprint=_table("fingerprint", data.get("fingerprint"), None,
                                      optional=True),
                   callbacks=_table("callbacks", data.get("callbacks"), None, optional=True),
                   stopped=_flag("stopped", data.get("stopped", False)),
                   inexact=tuple(_names("inexact", data.get("inexact", []))),
                   time=None if data.get("time") is None else _number("time", data["time"]))


def _text(name: str, value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise ValueError(f"{name} must be a string. Received: {name}={value!r}")


def _flag(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise ValueError(f"{name} must be true or false. Received: {name}={value!r}")


def _names(name: str, value: Any) -> list[str]:
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    raise ValueError(f"{name} must be a list of strings. Received: {name}={value!r}")


def _number(name: str, value: Any) -> float:
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    raise ValueError(f"{name} must be a number. Received: {name}={value!r}")


def _series(name: str, value: Any) -> list[float]:
    if isinstance(value, list):
        return [_number(name, v) for v in value]
    raise ValueError(f"{name} must be a list of numbers. Received: {name}={value!r}")


def _table(name: str, value: Any, item: Any, optional: bool = False) -> Any:
    """A JSON object of string keys (each value checked by ``item`` when given)."""
    if value is None and optional:
        return None
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ValueError(f"{name} must be a JSON object. Received: {name}={value!r}")
    if item is None:
        return dict(value)
    return {k: item(f"{name}[{k!r}]", v) for k, v in value.items()}
