"""How ``memfit run`` (the parent) and ``memfit.session()`` (in the child) talk.

The parent starts the training command with these environment variables:

    MEMFIT_WORKDIR          the run's workdir (shared log, checkpoints/)
    MEMFIT_SUPERVISOR       the parent's pid: the child may exit to be restarted
    MEMFIT_RESTART_EVERY    restart after this many epochs in one process (unset: never)
    MEMFIT_MAX_RSS          the parent's --max-rss in bytes (the child checks its baseline)

(their names are in :mod:`memfit.env`). To ask for a graceful restart, the parent
writes the file ``WORKDIR/restart.request``: a :class:`RestartRequest` (one JSON
object: ``reason``, ``rss``). The child's session checks for it after every
training step; on seeing it, it finishes the step, checkpoints and exits with
``memfit.exitcodes.RESTART`` (75). A user may do the same by hand:
``echo '{"reason": "manual"}' > WORKDIR/restart.request``. Exit codes are in
:mod:`memfit.exitcodes`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from memfit import checks
from memfit.atomic import write_text_atomic
from memfit.errors import MemfitError

__all__ = ["SessionConfigError", "DEFAULT_WORKDIR", "REQUEST_NAME", "RestartRequest",
           "write_request", "read_request", "clear_request"]

DEFAULT_WORKDIR = "memfit-run"      # of `memfit run` and a session not given one
REQUEST_NAME = "restart.request"


class SessionConfigError(MemfitError):
    """The run cannot go on as configured; a supervisor stops instead of restarting (the
    child exits with ``memfit.exitcodes.CONFIG``)."""


@dataclasses.dataclass(frozen=True)
class RestartRequest:
    """A restart asked of the training process.

    Example:
        >>> RestartRequest.from_json({"reason": "max-rss", "rss": 2**30})
        RestartRequest(reason='max-rss', rss=1073741824)

    Attributes:
        reason: why (``"max-rss"``, ``"manual"``...); the checkpoint records it.
        rss: the anonymous RSS that asked for it, in bytes, or ``None``.
    """

    reason: str
    rss: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON object written in ``restart.request``."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, data: Any) -> RestartRequest:
        """The request in a ``restart.request`` object, checked.

        Raises:
            ValueError: it is not an object with a string ``reason`` (and an integer
                ``rss``, if any).
        """
        if not isinstance(data, dict) or not isinstance(data.get("reason"), str):
            raise ValueError(f"a restart request must be a JSON object with a reason, such "
                             f"as {{\"reason\": \"manual\"}}. Received: {data!r}")
        return cls(reason=data["reason"],
                   rss=checks.count("rss", data.get("rss"), minimum=0, optional=True))


def write_request(workdir: str | os.PathLike, reason: str, *, rss: int | None = None) -> Path:
    """Asks the session in ``workdir`` to checkpoint and exit for a restart."""
    path = Path(workdir) / REQUEST_NAME
    write_text_atomic(path, json.dumps(RestartRequest(reason, rss).to_json()))
    return path


def read_request(workdir: str | os.PathLike) -> RestartRequest | None:
    """The pending request in ``workdir``, or ``None`` (one that is not a valid request
    counts as ``RestartRequest("request")``: it was written by hand)."""
    path = Path(workdir) / REQUEST_NAME
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, IsADirectoryError):
        return None
    try:
        return RestartRequest.from_json(json.loads(text))
    except ValueError:                  # json.JSONDecodeError is one too
        return RestartRequest("request")


def clear_request(workdir: str | os.PathLike) -> None:
    """Removes a pending request (the parent does, before it starts a child)."""
    (Path(workdir) / REQUEST_NAME).unlink(missing_ok=True)
