"""``memfit doctor``: run a training command for a few steps and say what to change.

    memfit.run_doctor(["python", "train.py"], steps=50)   the run, its ranked findings
    diagnose(facts)                                  the rules alone, on measurements
                                                     (from memfit.doctor import diagnose)

One concept per module: :mod:`~memfit.doctor.site` (the ``sitecustomize`` shim that puts
the probe into the command), :mod:`~memfit.doctor.hook` (waits for Keras),
:mod:`~memfit.doctor.fit_probe` (the in-process measurements and the stop),
:mod:`~memfit.doctor.arrays` and :mod:`~memfit.doctor.pipeline` (what holds memory),
:mod:`~memfit.doctor.gpu`, :mod:`~memfit.doctor.findings` (the rules),
:mod:`~memfit.doctor.report` (text and JSON) and :mod:`~memfit.doctor.checkup` (the parent).

Calling this package as ``memfit.doctor(...)`` still runs :func:`memfit.run_doctor` for this
release, with a DeprecationWarning. Nothing here imports TensorFlow; the probe imports
what it measures, in the child.

Example:
    >>> import memfit
    >>> result = memfit.run_doctor(["python", "train.py"], steps=50)    # doctest: +SKIP
    >>> print(result)                                               # doctest: +SKIP
"""

from memfit.callable_package import make_callable
from memfit.doctor.checkup import doctor
from memfit.doctor.facts import Facts, Finding
from memfit.doctor.findings import diagnose
from memfit.doctor.report import DoctorResult

__all__ = ["doctor", "DoctorResult", "Finding", "Facts", "diagnose"]

# memfit.doctor(...) runs the function for one more release, with a DeprecationWarning
make_callable(__name__, "memfit.doctor.checkup:doctor", "run_doctor")
