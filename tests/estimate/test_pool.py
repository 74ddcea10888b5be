"""oneDNN's BFC pool as the play replays it (memfit.estimate.pool): the rules of
bfc_allocator.cc, and which of the play's buffers it serves."""

from memfit.estimate.pool import POOL_THRESHOLD, Pool, play_pool
from memfit.estimate.schedule import Executor, Op
from memfit.estimate.step_peak import peak

MiB = 2**20


def test_requests_are_rounded_to_256_bytes_and_a_chunk_under_twice_is_not_split():
    pool = Pool()
    pool.allocate(2 * MiB - 100)              # rounded up, the 2 MiB region taken whole
    assert pool.in_use == 2 * MiB and pool.region_bytes == 2 * MiB
    pool = Pool()
    pool.allocate(MiB - 100)                   # 1 MiB - 100 -> split off the rest
    assert pool.in_use == MiB


def test_regions_double_and_are_never_given_back():
    pool = Pool()
    handles = [pool.allocate(2 * MiB) for _ in range(3)]     # 2, 4 (split), 8 (split)...
    assert [s for _, s in pool.regions] == [2 * MiB, 4 * MiB]
    for h in handles:
        pool.free(h)
    assert pool.in_use == 0 and pool.region_bytes == 6 * MiB
    pool.allocate(5 * MiB)                     # fits no free chunk: a region of 8 MiB
    assert [s for _, s in pool.regions] == [2 * MiB, 4 * MiB, 8 * MiB]


def test_a_request_larger_than_the_next_region_doubles_it_until_it_fits():
    pool = Pool()
    pool.allocate(9 * MiB)
    assert pool.region_bytes == 16 * MiB
    pool.allocate(15 * MiB)                    # did not grow this time: the next is 32
    assert [s for _, s in pool.regions] == [16 * MiB, 16 * MiB]


def test_freed_neighbours_merge_and_best_fit_takes_the_smallest_chunk():
    pool = Pool()
    big = pool.allocate(4 * MiB)               # a region of 4 MiB, whole
    a, b, c = (pool.allocate(MiB) for _ in range(3))   # another 4 MiB: a b c + 1 MiB
    pool.free(a)
    pool.free(b)                               # a and b merge: 2 MiB free
    assert sorted(s for bin_ in pool.bins for s, _, _ in bin_) == [MiB, 2 * MiB]
    d = pool.allocate(MiB)                     # the 1 MiB tail, the smallest that fits
    assert pool.chunks[d].ptr == pool.regions[1][0] + 3 * MiB
    e = pool.allocate(2 * MiB)                 # the 2 MiB hole: no new region
    assert pool.chunks[e].ptr == pool.regions[1][0] and pool.region_bytes == 8 * MiB
    del big, c


def test_touched_pages_are_what_was_written_not_the_regions():
    pool = Pool()
    h = pool.allocate(3 * MiB)                 # a 4 MiB region, 3 MiB written
    assert pool.region_bytes == 4 * MiB and pool.touched == 3 * MiB
    pool.free(h)
    pool.allocate(MiB)                         # the same pages again
    assert pool.touched == 3 * MiB


def test_play_pool_reports_the_step_peak_over_kept_buffers():
    step = [([("x", 3 * MiB), ("y", MiB)], []), ([], ["x", "y"])]
    p = play_pool([step] * 3, kept=[MiB, 1000], step_inputs=[MiB])
    assert p.in_use == 5 * MiB + MiB            # inputs, x (a whole 4 MiB chunk), y
    assert p.touched >= 5 * MiB


def test_the_play_sends_buffers_of_256_kib_or_more_to_the_pool_only():
    small, large = POOL_THRESHOLD // 2, POOL_THRESHOLD
    ops = [Op(0, "x", "Mul", [], [], [("x:0", small, 0)]),
           Op(1, "y", "Mul", ["x:0"], [], [("y:0", large, 0)]),
           Op(2, "z", "Mul", ["y:0"], [], [("z:0", 8, 0)])]
    events = Executor(ops, {"z:0"}, threads=1, batch_size=1).play()
    p = peak(events, 1, 128 * 2**10, is_backward=lambda name: False, pool=True)
    assert p.mmap_bytes == small               # mapped by glibc (fixed 128 KiB threshold)
    assert p.heap_bytes == 8
    assert p.pool_in_use == large and p.pool_bytes == large
    # TensorFlow's own allocator (oneDNN off): no pool, glibc maps the large buffer too.
    p = peak(events, 1, 128 * 2**10, is_backward=lambda name: False)
    assert p.mmap_bytes == small + large and p.pool_bytes == p.pool_in_use == 0


def test_the_pool_is_played_once_per_play_and_scaled_to_the_batch():
    # The estimate's high end asks for one play (here at batch 2) at many batch sizes:
    # the pool is played with that play's sizes once, and its pages scale to the batch.
    ops = [Op(0, "x", "Mul", [], [], [("x:0", 0, POOL_THRESHOLD)]),
           Op(1, "y", "Mul", ["x:0"], [], [("y:0", 0, POOL_THRESHOLD)]),
           Op(2, "z", "Mul", ["y:0"], [], [("z:0", 8, 0)])]
    events = Executor(ops, {"z:0"}, threads=1, batch_size=2).play()
    memo: dict = {}
    at = [peak(events, b, None, is_backward=lambda name: False, split_batch=2, pool=True,
               memo=memo) for b in (2, 4, 8)]
    assert len(memo) == 1
    assert [p.pool_bytes for p in at] == [
        peak(events, b, None, is_backward=lambda name: False, split_batch=2,
             pool=True).pool_bytes for b in (2, 4, 8)]
    assert at[0].pool_bytes < at[1].pool_bytes < at[2].pool_bytes
