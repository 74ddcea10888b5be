"""``too-short``: the verdict of a run too short to judge, the same in every view."""

from memfit.memory.classifier import EXPLANATIONS, KINDS, MIN_VALUES, TOO_SHORT, classify

MiB = 2**20


def test_the_classifier_says_how_many_epochs_it_needs_and_had():
    v = classify([100 * MiB, 300 * MiB, 500 * MiB], warmup_epochs=1)   # steep, but 2 values
    assert v.kind == TOO_SHORT == "too-short" and TOO_SHORT in KINDS
    assert v.headline == (f"too short to judge: needs ≥ {MIN_VALUES} epoch ends after the "
                          "warm-up, had 2")
    assert (v.needed, v.had, v.unit) == (MIN_VALUES, 2, "epochs")
    assert v.explanation == EXPLANATIONS[TOO_SHORT][0] and "does not guess" in v.explanation
    record = v.to_record()
    assert record["verdict"] == "too-short" and record["needed"] == MIN_VALUES
    assert "leak" not in v.headline and v.epochs_to_budget is None


def test_one_more_epoch_and_the_same_run_is_judged():
    values = [100 * MiB + 50 * MiB * i for i in range(MIN_VALUES + 1)]
    assert classify(values[:-1]).kind == TOO_SHORT
    assert classify(values).kind == "leak"


def test_the_monitor_says_too_short_at_the_end_and_logs_no_verdict(tmp_path, capsys):
    import memfit
    from memfit.memory.log import read_log

    m = memfit.MemoryMonitor(tmp_path, every_n_batches=0)
    m.on_train_begin()
    for epoch in range(3):
        m.on_epoch_end(epoch)
    m.on_train_end()
    err = capsys.readouterr().err
    assert m.verdict.kind == TOO_SHORT
    assert "memfit: too short to judge: needs ≥ 4 epoch ends after the warm-up, had 2" in err
    assert not [r for r in read_log(tmp_path / "memory.jsonl") if r["event"] == "verdict"]


def test_the_report_names_it_too_short(tmp_path):
    from memfit.memory.log import MemoryLog
    from memfit.report import write_report

    with MemoryLog(tmp_path / "memory.jsonl", source="monitor") as log:
        for epoch in range(2):
            log.write("epoch_end", epoch=epoch, rss_anon=100 * MiB, rss_file=0, rss=100 * MiB)
    result = write_report(tmp_path)
    assert [v.kind for v in result.verdicts] == [TOO_SHORT]
    page = result.html.read_text()
    assert ">too-short</span>needs ≥ 5 epoch ends in one process, had 2" in page


def test_the_doctor_says_growth_was_too_short_to_judge():
    from memfit.doctor.report import DoctorResult
    from memfit.memory.classifier import too_short

    outside = {**too_short(5.0, 1.2, "s").to_record(), "basis": "time slices"}
    text = str(DoctorResult(command=("python", "train.py"), exit_code=0, duration=3.0,
                            findings=(), verdict=outside))
    assert "No memory problem found in this run" in text
    assert ("Memory growth: too short to judge: needs ≥ 5.0 s of steady time after the "
            "start-up and warm-up, had 1.2 s; give the doctor a longer run") in \
        " ".join(text.split())
    judged = {**outside, "verdict": "stable", "headline": "stable: ..."}
    assert "Memory growth:" not in str(DoctorResult(command=("python", "train.py"),
                                                    exit_code=0, duration=3.0, findings=(),
                                                    verdict=judged))
