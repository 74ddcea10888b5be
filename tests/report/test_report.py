import base64
import html
import json
import re
import struct

import pytest

from memfit.cli import main
from memfit.memory.classifier import EXPLANATIONS
from memfit.memory.log import LogError, MemoryLog
from memfit.report import ReportResult, RunData, load, timeline, write_report
from memfit.report.summary import summarize
from memfit.report.timeline_plot import title
from memfit.workdir import Workdir
from tests.report.synthetic import (
    CHILD1,
    CHILD2,
    MAX_RSS,
    SUPERVISOR,
    T0,
    MiB,
    leak_then_restart,
    simple_leak,
    start,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_MAGIC
    return struct.unpack(">II", data[16:24])


@pytest.fixture
def restart_workdir(tmp_path):
    wd = Workdir(tmp_path / "run").create()
    leak_then_restart(wd.log)
    return wd


def test_load_groups_records_by_pid(restart_workdir):
    data = load(restart_workdir.path)
    assert isinstance(data, RunData)
    assert data.log == restart_workdir.log
    assert list(data.processes) == [SUPERVISOR, CHILD1, CHILD2]
    sup, c1, c2 = data.processes.values()
    assert sup.start is not None and c1.start is None
    assert "train.py" in sup.command
    assert [len(p.epoch_ends) for p in (sup, c1, c2)] == [0, 6, 4]
    assert all(a["t"] <= b["t"] for a, b in zip(c1.records, c1.records[1:], strict=False))
    assert [r["event"] for r in data.events("restart", "exit", "stop")] == [
        "restart", "exit", "exit", "stop"]
    assert load(restart_workdir.log).records == data.records     # a log file works the same


def test_timeline_is_a_png_with_a_device_panel_only_when_gpu_fields_exist(tmp_path):
    simple_leak(tmp_path / "gpu.jsonl", gpu=True)
    simple_leak(tmp_path / "cpu.jsonl", gpu=False)
    out = timeline(load(tmp_path / "gpu.jsonl"), tmp_path / "gpu.png")
    assert out == tmp_path / "gpu.png"
    gpu = out.read_bytes()
    cpu = timeline(load(tmp_path / "cpu.jsonl"), tmp_path / "cpu.png").read_bytes()
    assert len(gpu) > 10_000 and len(cpu) > 10_000
    (gw, gh), (cw, ch) = png_size(gpu), png_size(cpu)
    assert gw == cw and gh > ch                  # the device panel makes the figure taller
    assert not list(tmp_path.glob(".tmp-*"))    # written under a temporary name, renamed


def test_write_report_in_a_workdir(restart_workdir, capsys):
    result = write_report(restart_workdir.path)
    assert isinstance(result, ReportResult)
    assert (result.html, result.png) == (restart_workdir.report, restart_workdir.timeline)
    png = result.png.read_bytes()
    assert png[:8] == PNG_MAGIC and len(png) > 10_000
    page = result.html.read_text()
    embedded = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert embedded and base64.b64decode(embedded.group(1)) == png
    assert "<link" not in page and "<script" not in page and "http" not in page
    for pid in (SUPERVISOR, CHILD1, CHILD2):
        assert f">{pid}<" in page
    # the log's last verdict event is the one shown, with its explanation and fix
    assert [v.kind for v in result.verdicts] == ["leak"]
    assert result.verdicts[0].origin == "log"
    assert html.escape(EXPLANATIONS["leak"][0]) in page
    assert html.escape(EXPLANATIONS["leak"][1]) in page
    assert 'class="kind">leak<' in page
    # restarts and exits with their reasons
    assert "restart: anonymous RSS 2.5 GiB &gt; --max-rss 2.5 GiB" in page
    assert "exit -9 (signal): stopped by the supervisor" in page
    assert "stop: training finished (10 epochs)" in page
    # the per-process table: child 1 grew past the budget, 6 epochs
    row = re.search(rf"<tr><td class=\"n\">{CHILD1}</td>.*?</tr>", page).group(0)
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row)
    assert cells[3] == str(len(load(restart_workdir.path).processes[CHILD1].samples))
    assert cells[4] == "2.5 GiB" and cells[8] == "6"
    assert result.summary[1].peak_anon > MAX_RSS
    assert not list(restart_workdir.path.glob(".tmp-*"))


def test_cli_prints_paths_and_the_verdict_computed_from_epoch_ends(tmp_path, capsys):
    log = tmp_path / "train.jsonl"
    values = simple_leak(log, epochs=6)
    assert main(["report", str(log)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"wrote {tmp_path / 'train.report.html'}"
    assert out[1] == f"wrote {tmp_path / 'train.timeline.png'}"
    assert out[2].startswith("verdict: pid 4242: leak: ")
    page = (tmp_path / "train.report.html").read_text()
    assert "classified from the anonymous RSS at each epoch end" in page
    assert html.escape(EXPLANATIONS["leak"][1]) in page
    assert len(values) == 6


def test_too_few_epochs_are_said_so(tmp_path, capsys):
    simple_leak(tmp_path / "short.jsonl", epochs=2, gpu=False)
    result = write_report(tmp_path / "short.jsonl")
    assert [(v.kind, v.origin) for v in result.verdicts] == [("too-short", "too-few-epochs")]
    assert "had 2 (too few epochs in one process)" in result.headline
    assert "at least 5" in result.html.read_text()
    # it did record epoch ends: it is told about epochs a process, not to record them
    assert "Record epoch ends" not in result.verdicts[0].fix
    assert "--restart-every N" in result.verdicts[0].fix


def test_a_log_without_epoch_ends_is_not_said_to_have_too_few(tmp_path):
    """A stranger's 11 epochs under memfit run, one process each and no MemoryMonitor,
    were told "had 0 (too few epochs)": the log has no epoch ends at all."""
    log = tmp_path / "run.jsonl"
    with MemoryLog(log, source="run", header=False) as w:
        start(w, 4242, source="run", command="train.py")
        for i in range(5):
            w.write("sample", t=T0 + i, pid=4242, rss=100 * MiB, rss_anon=90 * MiB)
    result = write_report(log)
    assert "the log has none (no MemoryMonitor)" in result.headline, result.headline
    assert "too few epochs" not in result.headline


def test_everything_from_the_log_is_escaped(tmp_path):
    log = tmp_path / "evil.jsonl"
    simple_leak(log, command="<script>alert('x')</script>", verdict=True)
    with MemoryLog(log, source="evil", header=False) as w:
        w.write("restart", pid=4242, t=T0 + 100, reason='<img src=x onerror="alert(1)">')
        w.write("verdict", pid=4242, t=T0 + 101, verdict="leak", headline="<b>bold</b>",
                explanation="a & b", fix="<script>fix()</script>")
    page = write_report(log).html.read_text()
    assert "<script" not in page and "<img src=x" not in page and "<b>bold" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "&lt;script&gt;fix()&lt;/script&gt;" in page and "a &amp; b" in page


def test_watch_style_log_gives_the_command_to_the_sampled_process(tmp_path):
    log = tmp_path / "watch.jsonl"
    with MemoryLog(log, source="watch", header=False) as w:
        start(w, 100, source="watch", command=["python", "train.py"])
        for i in range(5):           # the watcher logs the watched process tree, not itself
            w.write("sample", pid=200, t=T0 + i, rss=(300 + i) * MiB, processes=3)
        w.write("exit", pid=200, t=T0 + 5, code=0, duration=5.0)
        w.write("verdict", pid=100, t=T0 + 5, verdict="stable", basis="time slices",
                note="outside epochs")
    result = write_report(log, tmp_path / "out" / "w.html")
    assert result.png == tmp_path / "out" / "w.png" and result.png.exists()
    child = next(s for s in result.summary if s.pid == 200)
    assert child.command == "python train.py" and child.samples == 5
    assert child.anon_is_total and child.peak_anon == 304 * MiB   # no anon split: total
    page = result.html.read_text()
    assert "Judged from time slices. outside epochs" in page
    assert "no anonymous/file split in the log: total RSS shown" in page
    assert "no samples of its own" not in page       # the watcher writes, but is not a row
    assert " · 1 process · " in page
    assert "<td>exit 0</td><td>duration=5.0 s</td>" in page


def test_output_may_be_a_directory(restart_workdir, tmp_path, capsys):
    assert main(["report", str(restart_workdir.path), "-o", str(tmp_path / "reports") + "/"]) == 0
    assert (tmp_path / "reports" / "report.html").exists()
    assert (tmp_path / "reports" / "timeline.png").exists()


def bad_sources(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "table.csv").write_text("t,rss\n1,2\n2,3\n")
    (tmp_path / "one.csv").write_text("t,rss")
    (tmp_path / "other.jsonl").write_text(json.dumps({"t": 1, "pid": 2, "event": "x"}) + "\n"
                                          + json.dumps({"t": 2, "pid": 2, "event": "y"}) + "\n")
    (tmp_path / "nolog").mkdir()
    return [
        (tmp_path / "missing", "No memfit workdir or log at"),
        (tmp_path / "empty.jsonl", "is empty"),
        (tmp_path / "table.csv", "is not a memfit log"),
        (tmp_path / "one.csv", "is not a memfit log"),
        (tmp_path / "other.jsonl", "is not a memfit log"),
        (tmp_path / "nolog", "has no memory log (memory.jsonl)"),
    ]


def test_bad_sources_are_clear_errors_with_exit_code_2(tmp_path, capsys):
    for source, message in bad_sources(tmp_path):
        assert main(["report", str(source)]) == 2, source
        err = capsys.readouterr().err
        assert err.startswith("memfit report: error: "), err
        assert message in err and repr(str(source)) in err, err
        with pytest.raises(LogError):
            load(source)
    assert not list(tmp_path.glob("*.html")) and not list(tmp_path.glob("*.png"))


def test_damaged_line_and_png_output_are_refused(tmp_path, capsys):
    log = tmp_path / "bad.jsonl"
    simple_leak(log, epochs=1)
    with open(log, "a") as f:
        f.write("not json\n" + json.dumps({"t": "soon", "pid": 1, "event": "sample"}) + "\n")
    assert main(["report", str(log)]) == 2
    assert "is not a memfit log record: 'not json'" in capsys.readouterr().err
    log.write_text(log.read_text().replace("not json\n", ""))
    assert main(["report", str(log)]) == 2
    assert "'t' must be a number" in capsys.readouterr().err
    good = tmp_path / "good.jsonl"
    simple_leak(good, epochs=1)
    assert main(["report", str(good), "-o", str(tmp_path / "x.png")]) == 2
    assert "Received: --output " in capsys.readouterr().err


def test_help_has_examples(capsys):
    with pytest.raises(SystemExit):
        main(["report", "--help"])
    out = capsys.readouterr().out
    assert "examples:" in out and "memfit report runs/exp1" in out and "-o" in out


def test_appended_watch_sessions_name_each_command(tmp_path):
    log = tmp_path / "memory.jsonl"
    with MemoryLog(log, source="watch", header=False) as w:
        for n, (watcher, child, script) in enumerate(((100, 200, "a.py"), (101, 201, "b.py"))):
            t = T0 + 100 * n
            start(w, watcher, t=t, source="watch", command=["python", script])
            for i in range(3):
                w.write("sample", pid=child, t=t + i + 1, rss=MiB, rss_anon=MiB, rss_file=0)
    data = load(tmp_path)
    assert data.processes[200].command == "python a.py"
    assert data.processes[201].command == "python b.py"
    assert data.processes[100].command == "python a.py"     # the watcher's own row


def watch_log(path):
    """A `memfit watch` log: the watcher (pid 100) writes, only the command (200) is sampled."""
    with MemoryLog(path, source="watch", header=False) as w:
        start(w, 100, source="watch", command=["python", "train.py"])
        for i in range(5):
            w.write("sample", pid=200, t=T0 + i, rss=(300 + i) * MiB, rss_anon=(250 + i) * MiB,
                    rss_file=50 * MiB)
        w.write("exit", pid=200, t=T0 + 5, code=0, peak_rss=361476096, seconds=65.25)
    return path


def test_the_title_counts_the_processes_the_summary_lists(tmp_path):
    # The watcher's own pid writes the log's start event but has no memory numbers: it is
    # not one of the run's processes, in the PNG's title as in the summary (issue 15).
    data = load(watch_log(tmp_path / "watch.jsonl"))
    assert len(data.processes) == 2 and [p.pid for p in data.measured] == [200]
    assert title(data).endswith(", 1 process")
    result = write_report(tmp_path / "watch.jsonl")
    assert [s.pid for s in result.summary] == [200]
    assert " · 1 process · " in result.html.read_text()
    leak_then_restart(tmp_path / "restart.jsonl")
    restarts = load(tmp_path / "restart.jsonl")
    assert title(restarts).endswith(f", {len(restarts.measured)} processes")
    assert len(restarts.measured) == len(write_report(tmp_path / "restart.jsonl").summary)


def test_event_details_show_sizes_and_durations_not_raw_numbers(tmp_path):
    page = write_report(watch_log(tmp_path / "watch.jsonl")).html.read_text()
    assert "<td>exit 0</td><td>peak_rss=344.7 MiB, seconds=1 min 05 s</td>" in page
    assert "361476096" not in page


def test_memfit_runs_max_rss_is_drawn_as_the_restart_threshold_not_a_budget(tmp_path,
                                                                            monkeypatch):
    """A stranger read memfit run's --max-rss line as a "budget": it is where a restart is
    asked for, and the plot says so."""
    import matplotlib.axes

    labels = []
    real = matplotlib.axes.Axes.axhline

    def spy(self, *args, **kwargs):
        labels.append(kwargs.get("label"))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "axhline", spy)
    leak_then_restart(tmp_path / "run.jsonl")
    timeline(load(tmp_path / "run.jsonl"), tmp_path / "run.png")
    assert [la for la in labels if la] == ["--max-rss (restart at) 2.5 GiB"], labels


def test_share_jobs_running_the_same_command_are_told_apart_by_name(tmp_path, monkeypatch):
    """A stranger's two memfit share jobs ran the same command: the legend named only pids
    and that command, so the lines looked alike. Each job's line carries its name."""
    import matplotlib.axes

    labels = []
    real = matplotlib.axes.Axes.plot

    def spy(self, *args, **kwargs):
        labels.append(kwargs.get("label"))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy)
    path = tmp_path / "share.jsonl"
    with MemoryLog(path, source="share", header=False) as log:
        start(log, 1, source="share", command="memfit share jobs.toml")
        for pid, name in ((101, "small"), (102, "large")):
            log.write("job_start", pid=pid, t=T0 + 0.5, job=name, command=["python", "t.py"])
            for i in range(5):
                log.write("sample", pid=pid, t=T0 + 1 + i, scope="tree",
                          rss=(200 + i) * MiB, rss_anon=(100 + i) * MiB, rss_file=100 * MiB)
    timeline(load(path), tmp_path / "share.png")
    named = [la for la in labels if la and "pid 10" in la]
    assert named == ["job small: pid 101 (python t.py)", "job large: pid 102 (python t.py)"], \
        labels


def test_the_table_and_the_timeline_give_one_peak_and_a_far_budget_is_named_not_drawn(
        tmp_path, monkeypatch):
    """A stranger's doctor workdir: the plot marked 550.5 MiB (an in-process record), the
    table said 498.9 (the outside samples). And an 8 GiB budget flattened a 288 MiB line
    into the bottom of the plot."""
    import matplotlib.axes

    drawn = {"annotate": [], "axhline": [], "labels": []}
    for name in ("annotate", "axhline"):
        real = getattr(matplotlib.axes.Axes, name)

        def spy(self, *args, _real=real, _name=name, **kwargs):
            drawn[_name].append(args[0] if _name == "annotate" else kwargs.get("label"))
            return _real(self, *args, **kwargs)
        monkeypatch.setattr(matplotlib.axes.Axes, name, spy)
    real_plot = matplotlib.axes.Axes.plot

    def plot(self, *args, **kwargs):
        drawn["labels"].append(kwargs.get("label"))
        return real_plot(self, *args, **kwargs)
    monkeypatch.setattr(matplotlib.axes.Axes, "plot", plot)
    log_path = tmp_path / "memory.jsonl"
    with MemoryLog(log_path, source="watch", header=False) as log:
        start(log, 77, source="watch", budget=8 * 2**30)
        for i in range(10):           # the tree, from outside
            log.write("sample", pid=77, t=T0 + i, scope="tree", rss_anon=(280 + i) * MiB,
                      rss_file=10 * MiB, rss=(290 + i) * MiB)
        log.write("train_begin", pid=77, t=T0 + 4.5, rss_anon=300 * MiB, rss_file=10 * MiB,
                  rss=310 * MiB)      # inside, between two outside samples
    data = load(log_path)
    [row] = summarize(data)
    assert row.peak_anon == 300 * MiB and row.samples == 10
    timeline(data, tmp_path / "t.png")
    assert drawn["annotate"] == ["peak 300.0 MiB"]
    assert drawn["axhline"] == [] and "budget 8.0 GiB (off the scale)" in drawn["labels"]


def test_a_doctors_workdir_shows_its_findings_and_no_fix_that_says_to_run_it(tmp_path,
                                                                              capsys):
    """A stranger's `memfit report` of a doctor's workdir said "Nothing to fix ... memfit
    doctor -- python train.py measures what holds it" beside the doctor's 219 MiB finding."""
    log_path = tmp_path / "memory.jsonl"
    with MemoryLog(log_path, source="doctor", header=False) as log:
        start(log, 9, source="doctor")
        for i in range(6):
            log.write("sample", pid=9, t=T0 + i, rss_anon=300 * MiB, rss_file=9 * MiB)
        log.write("verdict", pid=9, t=T0 + 7, verdict="stable", headline="stable: level",
                  explanation="x", fix="Nothing to fix: `memfit doctor -- python t.py` "
                                       "measures what holds it.")
        log.write("findings", pid=8, t=T0 + 8, kinds=["allocator-retention"],
                  bytes=[230 * MiB], steps=30)
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == ("memfit doctor found allocator-retention (about 230.0 MiB "
                                    "at stake); its report is in doctor.json here")
    page = (tmp_path / "report.html").read_text()
    assert "measures what holds it" not in page and "See memfit doctor&#x27;s findings" in page
    assert "allocator-retention (about 230.0 MiB at stake)" in page


def test_marks_too_close_for_their_own_label_share_the_one_before(tmp_path, monkeypatch):
    """A stranger's share report: jobs ending within a second of each other in a
    minute-long run drew their rotated labels over each other. Each mark keeps its line;
    a label names how many follow too close for their own."""
    import matplotlib.axes

    texts = []
    real = matplotlib.axes.Axes.text

    def spy(self, x, y, s, *args, **kwargs):
        texts.append(s)
        return real(self, x, y, s, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "text", spy)
    path = tmp_path / "share.jsonl"
    with MemoryLog(path, source="share", header=False) as log:
        start(log, 1, source="share", command="memfit share jobs.toml")
        for pid in (101, 102, 103, 104):
            for i in range(60):
                log.write("sample", pid=pid, t=T0 + i, scope="tree", rss=200 * MiB,
                          rss_anon=100 * MiB, rss_file=100 * MiB)
        for n, at in enumerate((20.0, 55.0, 55.7, 56.4)):   # > 1 % apart, < 3 %
            log.write("exit", pid=101 + n % 4, t=T0 + at, code=0, reason="finished")
    timeline(load(path), tmp_path / "share.png")
    marks = [t for t in texts if t.startswith("exit")]
    assert len(marks) == 2, texts
    assert "more just after" not in marks[0] and "(+2 more just after)" in marks[1]
