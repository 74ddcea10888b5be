"""memfit.checks: one rule per kind of argument, one wording, the value quoted."""

import numpy as np
import pytest

from memfit import checks


def test_a_count_is_an_integer_not_a_bool_and_numpy_integers_are_counts():
    assert checks.count("epochs", 3) == 3
    assert checks.count("epochs", np.int64(3)) == 3 and type(checks.count("n", np.int8(1))) is int
    assert checks.count("keep", 0, minimum=0) == 0
    assert checks.count("start", None, optional=True) is None
    for bad in (True, 0, -1, 2.0, "3", None):
        with pytest.raises(ValueError, match=r"epochs must be an integer >= 1, such as 3\. "
                                             rf"Received: epochs={bad!r}$"):
            checks.count("epochs", bad)


def test_seconds_numbers_flags_and_choices():
    assert checks.seconds("interval", 1) == 1.0
    assert checks.seconds("grace", 0, positive=False) == 0.0
    assert checks.number("num_cpus", 0.5) == 0.5
    assert checks.flag("shuffle", False) is False
    assert checks.choice("on_leak", "warn", ("warn", "stop")) == "warn"
    cases = [(checks.seconds, ("interval", 0), "positive number of seconds"),
             (checks.seconds, ("interval", float("nan")), "positive number of seconds"),
             (checks.number, ("num_cpus", -1), "number >= 0"),
             (checks.number, ("num_cpus", float("inf")), "number >= 0"),
             (checks.flag, ("shuffle", 1), "True or False"),
             (checks.choice, ("on_leak", "Warn", ("warn", "stop")), "one of 'warn', 'stop'")]
    with pytest.raises(ValueError, match="grace must be a non-negative number of seconds"):
        checks.seconds("grace", -1, positive=False)
    for check, args, words in cases:
        with pytest.raises(ValueError) as e:
            check(*args)
        assert words in str(e.value) and f"Received: {args[0]}={args[1]!r}" in str(e.value)
