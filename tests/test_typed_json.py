"""What crosses a file as a dataclass goes as JSON data and comes back the same, checked
against its type hints; the Ray driver's request and result are such files."""

import json
import sys

import pytest

from memfit import typed_json
from memfit.share.cluster_driver import DriverRequest, DriverResult, Failure
from memfit.share.cluster_nodes import Node
from memfit.share.planner import plan
from memfit.share.share_results import RayJobResult
from memfit.share.states import JobState


@pytest.fixture
def share_plan(tmp_path):
    return plan([{"name": "a", "command": [sys.executable, "-c", "pass"], "need": "64MiB"},
                 {"name": "b", "command": [sys.executable, "-c", "pass"], "need": "32MiB",
                  "env": {"X": "1"}}],
                budget="1GiB", overhead="100MiB", workdir=tmp_path / "wd")


def test_the_driver_request_and_result_come_back_equal(tmp_path, share_plan):
    request = DriverRequest(plan=share_plan, address=None, memory=2**30, interval=0.5,
                            num_cpus=1.5, max_retries=3, since=1.25, card=None, quiet=True,
                            joined="local")
    typed_json.write(tmp_path / "request.json", request)
    back = typed_json.read(DriverRequest, tmp_path / "request.json")
    assert back == request
    assert back.plan.workdir == share_plan.workdir and type(back.plan.jobs) is tuple

    job = share_plan.jobs[0]
    record = RayJobResult(name=job.name, state=JobState.STOPPED, exit_code=-9,
                          reason="over its share", peak=5 * 2**20, host_peak=None,
                          share=job.charge, need=job.need, need_source=job.need_source,
                          pid=123, started=1.0, ended=2.5, restarts=0,
                          directory=tmp_path / "wd" / "jobs" / "a", node="n1",
                          node_id="abc", address="127.0.0.1", attempt=2)
    node = Node(node_id="abc", name="n1", address="127.0.0.1", memory=2**30, cpus=2.0,
                gpus=0.0, gpu_memory=None)
    result = DriverResult(plan=share_plan, nodes=(node,), records={"a": record},
                          interrupted=False, error=None)
    typed_json.write(tmp_path / "result.json", result)
    back = typed_json.read(DriverResult, tmp_path / "result.json")
    assert back == result
    assert type(back.records["a"]) is RayJobResult and back.records["a"].state is \
        JobState.STOPPED
    failed = DriverResult(error=(Failure.FIT, "job 'a' fits no node"))
    typed_json.write(tmp_path / "failed.json", failed)
    assert typed_json.read(DriverResult, tmp_path / "failed.json") == failed
    # The file is plain data: no class names, nothing that could be run.
    text = (tmp_path / "result.json").read_text()
    assert json.loads(text)["records"]["a"]["state"] == JobState.STOPPED.value
    assert "RayJobResult" not in text and "__" not in text


def test_a_value_of_the_wrong_type_is_named_by_its_place(tmp_path, share_plan):
    data = typed_json.dump(DriverResult(plan=share_plan))
    data["plan"]["jobs"][1]["charge"] = "lots"
    with pytest.raises(ValueError, match=r"DriverResult\.plan\.jobs\[1\]\.charge: expected int"):
        typed_json.load(DriverResult, data)
    data = typed_json.dump(DriverResult(error=(Failure.FIT, "x")))
    data["error"][0] = "no-such-failure"
    with pytest.raises(ValueError, match=r"DriverResult\.error\[0\]: expected Failure"):
        typed_json.load(DriverResult, data)
    with pytest.raises(ValueError, match="unknown fields \\['extra'\\]"):
        typed_json.load(DriverResult, {"extra": 1})
    with pytest.raises(ValueError, match="missing field 'since'"):
        typed_json.load(DriverRequest, {"plan": data["plan"] if data["plan"] else
                                        typed_json.dump(share_plan), "address": None,
                                        "memory": None, "interval": 1.0, "num_cpus": 1,
                                        "max_retries": 3})
    (tmp_path / "pickled").write_bytes(b"\x80\x04\x95\x10\x00cos\nsystem\n")
    with pytest.raises(ValueError, match="is not JSON"):
        typed_json.read(DriverResult, tmp_path / "pickled")


def test_booleans_are_not_integers_and_integers_are_floats():
    assert typed_json.load(float, 3) == 3.0 and type(typed_json.load(float, 3)) is float
    with pytest.raises(ValueError):
        typed_json.load(int, True)
    with pytest.raises(ValueError):
        typed_json.load(float, False)
    with pytest.raises(TypeError, match="cannot write a set"):
        typed_json.dump({1, 2})
