"""The serving engine (sessions/serve/): a request's greedy tokens are generate()'s for it
alone, whatever the traffic; the pool drains; abort, static batching, seeded sampling and
bad requests; the paged step against a full forward pass, and rows that are not live.

Two small models, each with the engine's two shapes compiled once: the course's (learned
positions, multi-head, ReLU, tied) and a LLaMA-like one (GQA, RoPE, gated, untied).
"""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sessions.errors import UsageError
from sessions.inference import generate
from sessions.inference.layout import decode_weights
from sessions.model import ModelConfig, forward, init_params
from sessions.serve import Engine
from sessions.serve.paged_cache import init_pool, paged_step, slot_step

COURSE = ModelConfig(embed=24, ff=40, heads=3, head_dim=8, layers=2, seq=16)
LLAMA = ModelConfig(
    embed=24, ff=40, heads=4, head_dim=8, layers=2, seq=16, kv_heads=2, rope=True,
    gated=True, tied=False,
)  # fmt: skip
# 3 slots, pages of 4 tokens, chunks of 4; 7 pages: fewer than 3 whole contexts (12).
SHAPE = {"slots": 3, "page_size": 4, "pages": 7, "prefill_chunk": 4}
NEAR_TIE = 1e-3  # the course's float32 threshold


@pytest.fixture(scope="module", params=[COURSE, LLAMA], ids=["course", "gqa-rope-gated-untied"])
def model(request):
    cfg = request.param
    params = init_params(cfg, jax.random.key(1))
    if cfg.learned_positions:  # drawn at std 0.01 (positions.py), they hardly move a token:
        params["pos"] = 50 * params["pos"]  # at 0.5, a position read wrong changes tokens
    return cfg, params


@pytest.fixture(scope="module")
def course_params():
    return init_params(COURSE, jax.random.key(1))


def serve(engine, requests, every=2):
    """Add requests one every `every` steps, step until done -> ({id: tokens}, {id: slots
    it ran in})."""
    out, slots = collections.defaultdict(list), collections.defaultdict(set)
    queue = list(requests)
    for step in range(400):
        if not queue and not engine.has_unfinished_requests():
            return out, slots
        if queue and step % every == 0:
            request_id, prompt, n, options = queue.pop(0)
            engine.add_request(request_id, prompt, n, **options)
        for request_id, tokens, _ in engine.step():
            out[request_id] += tokens
        for slot, r in engine.scheduler.running.items():
            slots[r.request_id].add(slot)
    raise AssertionError("the engine did not drain in 400 steps")


def alone(params, cfg, prompt, n):
    """generate()'s greedy tokens for the prompt alone, and how many of them to hold the
    engine to: up to the first near-tie of the top two logits of a full forward pass."""
    full = generate(params, cfg, jnp.array([prompt]), n)
    logits = forward(params, full[:, :-1], cfg)[0, len(prompt) - 1 :]  # [n, V]: each output's
    top2 = jax.lax.top_k(logits, 2)[0]
    ties = np.flatnonzero(np.asarray(top2[:, 0] - top2[:, 1]) < NEAR_TIE)
    return np.asarray(full[0, len(prompt) :]).tolist(), int(ties[0]) if len(ties) else n


def test_greedy_tokens_are_generate_s_alone_under_staggered_arrivals_and_preemption(model):
    cfg, params = model
    rng = np.random.default_rng(0)
    lengths = (9, 2, 6, 9, 6, 2)  # three longer than a chunk of 4; three lengths: 3 compiles
    prompts = [rng.integers(0, cfg.vocab, n).tolist() for n in lengths]
    engine = Engine(params, cfg, **SHAPE)
    requests = [(f"r{i}", p, cfg.seq - len(p), {}) for i, p in enumerate(prompts)]
    programs = slot_step._cache_size()
    out, slots = serve(engine, requests)
    assert slot_step._cache_size() <= programs + 2  # a decode and a chunk: no step retraces
    stats = engine.stats()
    assert stats["preemptions"] > 0
    assert len(set().union(*slots.values())) == SHAPE["slots"]  # every slot served
    assert stats["pages_free"] == stats["pages_total"] == SHAPE["pages"]
    assert stats["running"] == stats["waiting"] == 0
    held = total = 0
    for i, prompt in enumerate(prompts):
        expected, upto = alone(params, cfg, prompt, cfg.seq - len(prompt))
        assert len(out[f"r{i}"]) == len(expected)
        assert out[f"r{i}"][:upto] == expected[:upto], f"r{i}"
        held, total = held + upto, total + len(expected)
    assert held >= 0.9 * total  # near-ties are rare: almost every token is held


def test_abort_frees_the_slot_and_pages_at_once_and_the_request_says_no_more(model):
    cfg, params = model
    engine = Engine(params, cfg, **SHAPE)
    engine.add_request("a", [5, 6, 7, 8, 9], 10)
    engine.add_request("b", [1, 2, 3], 10)
    engine.add_request("c", [4, 4], 5)
    for _ in range(3):
        engine.step()
    before = engine.stats()
    assert before["running"] == 3
    engine.abort_request("a")  # a: prompt 5 and 2 tokens fed: 2 pages
    after = engine.stats()
    assert after["running"] == 2 and after["pages_free"] == before["pages_free"] + 2
    said = [request_id for _ in range(20) for request_id, _, _ in engine.step()]
    assert "a" not in said and {"b", "c"} <= set(said)
    engine.add_request("d", [3], 3)
    engine.abort_request("d")  # still waiting
    assert engine.stats()["waiting"] == 0
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.stats()["pages_free"] == SHAPE["pages"]


def test_a_sampled_request_s_tokens_do_not_depend_on_its_slot_or_neighbours(model):
    cfg, params = model
    sampled = ("x", [10, 20, 30], 12, {"temperature": 1.0, "seed": 7})
    by_itself, _ = serve(Engine(params, cfg, **SHAPE), [sampled])
    neighbours = [("n0", [1, 2, 3, 4, 5], 9, {}), ("n1", [9], 8, {"temperature": 0.5, "seed": 1})]
    crowded, slots = serve(Engine(params, cfg, **SHAPE), [*neighbours, sampled], every=1)
    assert slots["x"] != {0}  # it ran beside others, in another slot
    assert crowded["x"] == by_itself["x"] and len(by_itself["x"]) == 12
    other_seed = ("x", [10, 20, 30], 12, {"temperature": 1.0, "seed": 8})
    assert serve(Engine(params, cfg, **SHAPE), [other_seed])[0]["x"] != by_itself["x"]


@pytest.mark.parametrize(
    "prompt, max_tokens, options",
    [
        ([], 3, {}),  # empty
        ([256], 3, {}),  # outside the vocabulary
        ([-1], 3, {}),
        ([1, 2], 0, {}),  # no token asked for
        ([1, 2], 15, {}),  # 17 tokens: past the context of 16
        ([1, 2], 3, {"temperature": -0.5}),
    ],
)
def test_requests_the_engine_could_never_serve_are_refused(
    course_params, prompt, max_tokens, options
):
    engine = Engine(course_params, COURSE, slots=2, page_size=4, pages=3, prefill_chunk=4)
    with pytest.raises(UsageError):
        engine.add_request("r", prompt, max_tokens, **options)


def test_a_request_larger_than_the_pool_or_already_queued_is_refused(course_params):
    engine = Engine(course_params, COURSE, slots=2, page_size=4, pages=3, prefill_chunk=4)
    engine.add_request("r", [1] * 8, 5)  # 12 tokens held at most: 3 pages, the pool
    with pytest.raises(UsageError, match="already"):
        engine.add_request("r", [1], 2)
    with pytest.raises(UsageError, match="pages"):
        engine.add_request("s", [1] * 8, 6)  # 13 tokens: 4 pages


def test_the_paged_step_equals_a_full_forward_pass_and_rows_not_live_write_nothing(model):
    cfg, params = model
    N, pages = 4, 8
    w = decode_weights(params, cfg)
    rng = np.random.default_rng(3)
    seqs = [rng.integers(0, cfg.vocab, 11).tolist(), rng.integers(0, cfg.vocab, 7).tolist()]
    # Row 0 owns pages 5, 2, 7; row 1 pages 0, 3; the rest of each table is the padding page.
    table = np.full((2, 4), pages, np.int32)
    table[0, :3], table[1, :2] = [5, 2, 7], [0, 3]
    pool = init_pool(cfg, pages, N)
    zeros = np.zeros(2, np.int32)

    def run(pool, starts, counts, C):
        tokens = np.zeros((2, C), np.int32)
        for r, (s, c) in enumerate(zip(starts, counts)):
            tokens[r, :c] = (seqs[r] + [0] * C)[s : s + c]  # token 0 past a sequence
        args = (np.array(starts, np.int32), np.array(counts, np.int32), zeros.astype(np.uint32))
        return paged_step(w, pool, table, tokens, *args, zeros, np.zeros(2, np.float32), cfg)

    _, _, pool = run(pool, [0, 0], [4, 4], 4)  # each row's first 4 tokens
    _, _, pool = run(pool, [4, 4], [4, 2], 4)  # row 0: 4..7, row 1: 4..5, at other starts
    token, gap, pool = run(pool, [8, 6], [3, 1], 4)  # row 0: 8..10, row 1: its last
    for r in range(2):
        logits = forward(params, jnp.array([seqs[r]]), cfg)[0, -1]
        top2 = jax.lax.top_k(logits, 2)[0]
        assert int(token[r]) == int(jnp.argmax(logits))
        np.testing.assert_allclose(gap[r], top2[0] - top2[1], rtol=1e-4, atol=1e-5)
    before = [np.asarray(layer["k"]).copy() for layer in pool] + [
        np.asarray(layer["v"]).copy() for layer in pool
    ]
    # Row 0 not live (count 0), aimed at positions 0.. of its own pages; row 1 writes
    # its position 7: page table[1, 7 // 4] = 3, offset 3.
    _, _, pool = run(pool, [0, 7], [0, 1], 1)
    after = [np.asarray(layer["k"]) for layer in pool] + [np.asarray(layer["v"]) for layer in pool]
    for b, a in zip(before, after):
        changed = {p for p in range(pages + 1) if not np.array_equal(b[p], a[p])}
        assert changed == {3}  # row 1's page alone; row 0's pages 5, 2, 7 untouched
