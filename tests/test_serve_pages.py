"""The page pool and the scheduler, on the host, without a model (sessions/serve/pages.py,
sessions/serve/scheduler.py): every expectation counted by hand."""

import pytest

from sessions.serve.pages import PagePool, pages_for
from sessions.serve.scheduler import Request, Scheduler


def test_pages_for_is_the_ceiling_of_tokens_over_the_page_size():
    assert [pages_for(t, 4) for t in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_allocation_is_all_or_nothing_and_release_gives_pages_back():
    pool = PagePool(5, page_size=4)
    first = pool.allocate(3)
    assert len(set(first)) == 3 and set(first) <= set(range(5)) and pool.free == 2
    assert pool.allocate(3) is None and pool.free == 2  # nothing taken
    second = pool.allocate(2)
    assert not set(first) & set(second) and pool.free == 0 and pool.used == 5
    pool.release(first)
    assert pool.free == 3
    with pytest.raises(ValueError):
        pool.release(first)  # twice
    with pytest.raises(ValueError):
        pool.release([5])  # the padding page is never given
    pool.release(second)
    assert pool.free == pool.total == 5


def test_the_watermark_keeps_pages_free():
    pool = PagePool(10, page_size=4)
    assert pool.allocate(9, keep=2) is None and pool.free == 10
    assert len(pool.allocate(8, keep=2)) == 8 and pool.free == 2
    assert pool.allocate(1, keep=2) is None and pool.allocate(1) is not None


def scheduler(slots=2, page_size=4, pages=20, policy="continuous", chunk=4, budget=6, keep=0):
    return Scheduler(slots, page_size, pages, 64, policy, chunk, budget, keep)


def request(i, prompt_len, max_tokens):
    return Request(f"r{i}", prompt_len, [1] * prompt_len, max_tokens, 0.0, 0, i)


def run_step(sched):
    """One step with token 7 for every request that gets one: (plan, finished ids)."""
    plan = sched.schedule()
    done = [r for r, _ in plan.decode] + [c.request for c in plan.chunks if c.final]
    return plan, [r.request_id for r in done if sched.commit(r, 7)]


def test_decodes_go_first_and_prefill_chunks_fill_the_rest_of_the_budget():
    # Budget 6, chunks of at most 4, two prompts of 10 (by hand):
    # step 0: A 0..4, B 0..2 | 1: A 4..8, B 2..4 | 2: A 8..10 (last), B 4..8
    # step 3: A decodes (1), B 8..10 (last: 2 of the 5 left) | 4: A and B decode.
    sched = scheduler()
    sched.add(request(0, 10, 5))
    sched.add(request(1, 10, 5))
    seen = []
    for _ in range(5):
        plan, _ = run_step(sched)
        chunks = [(c.request.request_id, c.start, c.count) for c in plan.chunks]
        seen.append(([r.request_id for r, _ in plan.decode], chunks))
    assert seen == [
        ([], [("r0", 0, 4), ("r1", 0, 2)]),
        ([], [("r0", 4, 4), ("r1", 2, 2)]),
        ([], [("r0", 8, 2), ("r1", 4, 4)]),
        (["r0"], [("r1", 8, 2)]),
        (["r0", "r1"], []),
    ]


def test_static_admits_nothing_until_its_whole_batch_has_finished():
    # Two slots, prompts of 2 (one chunk each), by hand: r0 and r1 start together, r0's
    # 3 tokens come at steps 0, 1, 2 and r1's 6 at steps 0..5. Continuous gives r0's
    # slot to r2 at step 3; static waits for r1 too, till step 6.
    for policy, expected in (("static", 6), ("continuous", 3)):
        sched = scheduler(policy=policy, budget=8)
        for i, n in enumerate((3, 6, 2)):
            sched.add(request(i, 2, n))
        started = None
        for step in range(12):
            run_step(sched)
            if started is None and any(r.request_id == "r2" for r in sched.running.values()):
                started = step
        assert started == expected, policy


def test_a_dry_pool_preempts_the_newest_running_request_to_the_front_of_the_queue():
    # 3 pages of 4 tokens; r0 and r1 prompts of 4 take a page each and decode from
    # position 4, each needing its second page: r0 (oldest) gets the last free one, r1
    # finds none, and r1 (the newest) is sent back to the front, ahead of r2.
    sched = scheduler(pages=3, budget=8)
    for i in range(3):
        sched.add(request(i, 4, 6))
    run_step(sched)  # both prefilled in one step; r2 waits: no slot
    plan, _ = run_step(sched)
    assert [r.request_id for r in plan.preempted] == ["r1"]
    assert [r.request_id for r, _ in plan.decode] == ["r0"]
    assert [r.request_id for r in sched.waiting] == ["r1", "r2"]
    assert sched.preemptions == 1 and sched.pool.free == 1  # r1's page back


def test_the_watermark_holds_back_admission_while_a_request_runs():
    # 4 pages, 1 kept: r0 (prompt 8: 2 pages) starts alone; r1 (2 pages) would leave 0.
    sched = scheduler(pages=4, keep=1, budget=10, chunk=8)
    sched.add(request(0, 8, 3))
    sched.add(request(1, 8, 3))
    run_step(sched)
    assert [r.request_id for r in sched.running.values()] == ["r0"]
    assert [r.request_id for r in sched.waiting] == ["r1"]


def test_every_page_and_slot_is_free_once_the_queue_drains():
    sched = scheduler(pages=5, slots=3, budget=7)
    for i, (p, n) in enumerate(((5, 4), (3, 9), (9, 2), (1, 6), (4, 4))):
        sched.add(request(i, p, n))
    finished = []
    for _ in range(60):
        finished += run_step(sched)[1]
    assert sorted(finished) == [f"r{i}" for i in range(5)]
    assert sched.pool.free == sched.pool.total and len(sched.free_slots) == 3
    assert not sched.has_work()
