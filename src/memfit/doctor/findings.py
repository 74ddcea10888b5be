"""The rules of ``memfit doctor``: from what one run measured to what to change.

Each rule reads :class:`~memfit.doctor.facts.Facts` (the probe's results from inside the
training process, and the process tree's memory seen from outside) and returns a
:class:`~memfit.doctor.facts.Finding` or ``None`` when it does not apply. A finding
carries the numbers measured in this run, why they matter, the exact memfit command or
code change that fixes it, and ``bytes``: the memory at stake (about what the fix saves),
by which :func:`diagnose` ranks findings. The rules live by what they are about, each
module with its thresholds and a table of when its rules apply:

===================  ============  ================================================
kind                 module        about
===================  ============  ================================================
data-in-ram          data_rules    the data set held in RAM (arrays given to fit,
                                   tensors, an in-memory cache, other arrays)
pipeline-buffers     data_rules    shuffle/prefetch buffers far larger than needed
allocator-retention  growth_rules  memory kept after del + gc.collect()
memory-growth        growth_rules  a leak, allocator retention or a large warm-up
activations          model_rules   activations dominate the model's training memory
gpu-no-limit         model_rules   a shared GPU without memory growth or a cap
===================  ============  ================================================

Example:
    >>> from memfit.doctor.facts import Facts
    >>> facts = Facts(command=("python", "train.py"), probe=None)
    >>> diagnose(facts)
    []
"""

from __future__ import annotations

from collections.abc import Callable

from memfit.doctor.data_rules import DATA_MIN, data_in_ram, pipeline_buffers
from memfit.doctor.facts import Facts, Finding
from memfit.doctor.growth_rules import kept_after_del, memory_growth
from memfit.doctor.model_rules import activations, gpu_no_limit

__all__ = ["RULES", "diagnose"]


RULES: tuple[Callable[[Facts], Finding | None], ...] = (
    kept_after_del, data_in_ram, activations, memory_growth, gpu_no_limit, pipeline_buffers)


def diagnose(facts: Facts) -> list[Finding]:
    """Applies every rule; the findings that apply, the most memory at stake first.

    Memory kept after ``del`` (allocator-retention) tells the whole story of data built
    in RAM and freed each epoch: it replaces data-in-ram (whose fix it carries) and a
    memory-growth finding that is not a leak.
    """
    found = [finding for rule in RULES if (finding := rule(facts)) is not None]
    leak = any(x.kind == "memory-growth" and x.details.get("verdict") == "leak" for x in found)
    data = next((x for x in found if x.kind == "data-in-ram"), None)
    if leak and data is not None and \
            data.details["held"] - data.details["other_arrays"] < DATA_MIN:
        # only arrays outside fit()'s arguments, while memory grows: the leak's suspects
        # (named in its finding), not data to stream
        found.remove(data)
    if any(x.kind == "allocator-retention" for x in found):
        found = [x for x in found if x.kind != "data-in-ram" and not (
            x.kind == "memory-growth" and x.details.get("verdict") != "leak")]
    return sorted(found, key=lambda finding: finding.bytes, reverse=True)
