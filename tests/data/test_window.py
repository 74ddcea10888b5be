"""memfit's C loops (memfit.data.format.cwindow) and the block reader's two
ways of placing samples: straight into batch rows, or gathered from scratch buffers."""

import shutil
import sysconfig

import google_crc32c
import numpy as np
import pytest

import memfit
from memfit.data.format import records
from memfit.data.format.manifest import Manifest
from memfit.data.read.blocks import block_reader as blocks
from memfit.data.read.blocks.block_plan import BlockReaderPlan
from tests.data.helpers import small_arrays


def test_the_c_extension_is_built_where_a_compiler_is():
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}) here: the block reader gathers instead")
    assert records.NATIVE is not None, "memfit.data.format.cwindow did not build: reinstall"


@pytest.mark.parametrize("native", [True, False])
def test_crc_of_scattered_records_matches_the_contiguous_bytes(native, monkeypatch):
    if native and records.NATIVE is None:
        pytest.skip("memfit.data.format.cwindow was not built (no C compiler at install)")
    if not native:
        monkeypatch.setattr(records, "NATIVE", None)
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, 10_000, dtype=np.uint8)
    # three records: pieces out of order in memory, one empty piece, one empty record
    cuts = [(0, 100), (500, 4000), (100, 500), (4000, 4000), (4000, 10_000)]
    pieces = np.array([[data.ctypes.data + a, b - a] for a, b in cuts], np.uint64)
    spans = np.array([[0, 3], [3, 3], [3, 5]], np.int64)
    got = records.crc32c_spans(pieces, spans)
    want = [google_crc32c.value(data[:100].tobytes() + data[500:4000].tobytes()
                                + data[100:500].tobytes()), 0,
            google_crc32c.value(data[4000:].tobytes())]
    assert got.dtype == np.uint32 and got.tolist() == want


def test_crc_spans_outside_the_pieces_are_refused():
    pieces = np.zeros((2, 2), np.uint64)
    with pytest.raises(ValueError, match="spans must lie within the 2 pieces"):
        records.crc32c_spans(pieces, np.array([[0, 3]], np.int64))
    with pytest.raises(ValueError, match=r"pieces.shape=\(2, 3\)"):
        records.crc32c_spans(np.zeros((2, 3), np.uint64), np.array([[0, 1]], np.int64))


def test_both_placements_give_the_same_windows(tmp_path, monkeypatch):
    memfit.pack(small_arrays(500), tmp_path / "ds", shards=3, samples_per_record=8,
                progress=False)
    m = Manifest.load(tmp_path / "ds")
    shards = m.splits["train"].shards

    def windows():
        plan = BlockReaderPlan(names=("x", "id"), seed=1, shuffle=True, cycle=3, window=96,
                               batch_size=32, samples=500)
        r = blocks.BlockReader(m, shards, plan, on_corrupt="raise")
        return r.direct, [r.window(1, w) for w in range(r.windows)]

    direct, got = windows()
    native = records.NATIVE
    monkeypatch.setattr(records, "NATIVE", None)
    gathered, want = windows()
    assert direct == (native is not None) and not gathered
    assert sorted(np.concatenate([w[1] for w in got]).tolist()) == list(range(500))
    for a, b in zip(got, want, strict=True):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
    plan = memfit.dataset(tmp_path / "ds", 32).memfit_plan
    assert "gathered into batches: memfit's C extension" in str(plan)
    monkeypatch.setattr(records, "NATIVE", native)
    plan = memfit.dataset(tmp_path / "ds", 32).memfit_plan
    assert ("straight into its batch row" in str(plan)) == (native is not None)
