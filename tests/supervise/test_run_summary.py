"""The summary's note on a run that never checkpointed says only what memfit knows."""

from pathlib import Path

from memfit.supervise.run_results import Cause, ChildRun, RunResult


def _result(causes, finished=False):
    children = tuple(ChildRun(pid=100 + i, exit_code=0 if c == Cause.FINISHED else 1, cause=c,
                              reason="" if c == Cause.FINISHED else "exit code 1",
                              started=0.0, ended=0.4, peak=None, resumed_at=(0, 0),
                              ended_at=(0, 0)) for i, c in enumerate(causes))
    return RunResult(exit_code=0 if finished else 1, finished=finished,
                     stop_reason=None if finished else "crash twice in a row",
                     children=children, epoch=0, duration=1.0, lost=0.0,
                     log_path=Path("memory.jsonl"), command=("python", "train.py"),
                     checkpointed=False)


def test_a_run_whose_every_process_crashed_is_not_said_to_lack_a_session():
    # a stranger's script used memfit.session(), but `python` on the PATH had no Keras:
    # it crashed at its import, and the note said it "does not train inside memfit.session()"
    text = str(_result([Cause.CRASH, Cause.CRASH]))
    assert "does not train inside" not in text
    assert "no process wrote a checkpoint: each crashed first" in text


def test_a_run_that_finished_without_a_checkpoint_is_still_told_to_add_a_session():
    text = str(_result([Cause.FINISHED], finished=True))
    assert "wrote no checkpoint (it does not train inside memfit.session())" in text
