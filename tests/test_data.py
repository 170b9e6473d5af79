"""Data and the overlapped loader: batches are a pure function of (seed,
step); the prefetcher yields the synchronous loader's batches, in order,
prepared ahead of a slow consumer."""

import time

import numpy as np
import pytest

from sessions import data
from sessions.errors import UsageError
from sessions.prefetch import Prefetcher, Synchronous

TOKENS = np.arange(1000, dtype=np.uint8)


def batch(step, **kw):
    return data.get_batch(TOKENS, step, **{"batch": 4, "seq": 8, "seed": 0, **kw})


def test_default_corpus_is_english_bytes():
    corpus = data.default_corpus()
    assert corpus.dtype == np.uint8 and len(corpus) > 400_000
    assert b"statement" in corpus[:100_000].tobytes()


def test_batches_are_a_pure_function_of_seed_and_step():
    np.testing.assert_array_equal(batch(3)["inputs"], batch(3)["inputs"])
    assert not np.array_equal(batch(3)["inputs"], batch(4)["inputs"])
    assert not np.array_equal(batch(3)["inputs"], batch(3, seed=1)["inputs"])
    assert not np.array_equal(batch(3)["inputs"], batch(3, stream=data.VAL)["inputs"])


def test_targets_are_inputs_shifted_by_one():
    b = data.get_batch(data.default_corpus(), 0, batch=3, seq=10, seed=0)
    assert b["inputs"].shape == b["targets"].shape == (3, 10)
    assert b["inputs"].dtype == np.int32
    np.testing.assert_array_equal(b["inputs"][:, 1:], b["targets"][:, :-1])


def test_a_process_loads_exactly_its_rows_of_the_global_batch():
    full = batch(5)
    part = batch(5, rows=slice(2, 4))
    np.testing.assert_array_equal(part["inputs"], full["inputs"][2:4])


def test_split_holds_out_the_last_tenth():
    train, val = data.split(TOKENS, seq=8)
    assert len(val) == 100 and len(train) == 900
    assert val[0] == TOKENS[900]


def test_unigram_entropy_of_uniform_and_constant_bytes():
    assert data.unigram_entropy(np.arange(256, dtype=np.uint8)) == pytest.approx(np.log(256))
    assert data.unigram_entropy(np.zeros(100, dtype=np.uint8)) == 0


def test_data_from_a_file_a_folder_and_a_glob(tmp_path):
    (tmp_path / "a.txt").write_text("hello ")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("world")
    assert data.tokens_to_text(data.load_corpus(str(tmp_path / "a.txt"))) == "hello "
    assert data.tokens_to_text(data.load_corpus(str(tmp_path))) == "hello world"
    assert data.tokens_to_text(data.load_corpus(str(tmp_path / "**" / "*.txt"))) == "hello world"


def test_large_folders_are_concatenated_once_into_a_mapped_file(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "IN_MEMORY_LIMIT", 4)
    (tmp_path / "a.txt").write_text("abc")
    (tmp_path / "b.txt").write_text("def")
    cache = tmp_path / "cache"
    tokens = data.load_corpus(str(tmp_path), cache_dir=str(cache))
    assert isinstance(tokens, np.memmap) and data.tokens_to_text(tokens) == "abcdef"
    assert len(list(cache.iterdir())) == 1


@pytest.mark.parametrize(
    "content, message",
    [(None, "no such file"), ("", "is empty"), ("x" * 50, "too short")],
)
def test_bad_data_is_a_usage_error(tmp_path, content, message):
    path = tmp_path / "corpus.txt"
    if content is not None:
        path.write_text(content)
    with pytest.raises(UsageError, match=message):
        data.split(data.load_corpus(str(path)), seq=64)


def test_prefetcher_yields_the_synchronous_batches_in_order():
    def place(b):
        return {k: v + 0 for k, v in b.items()}

    make = batch
    sync = Synchronous(make, place, start=7)
    with Prefetcher(make, place, start=7, depth=3) as ahead:
        for _ in range(10):
            a, b = next(sync), next(ahead)
            np.testing.assert_array_equal(a["inputs"], b["inputs"])
            np.testing.assert_array_equal(a["targets"], b["targets"])


def test_prefetcher_runs_ahead_of_a_slow_consumer():
    """While the consumer holds batch 0, the thread prepares the next `depth`
    batches, and no more: shown by the order of events, not by a clock."""
    events = []
    with Prefetcher(batch, lambda b: b, depth=2, events=events) as ahead:
        next(ahead)
        # The consumer is "busy": watch the events until the thread has filled
        # the queue. 3 = the two queued batches plus one waiting to be put.
        for _ in range(3000):
            if ("load", 3) in events:
                break
            time.sleep(0.01)
        assert ("load", 3) in events
        assert ("load", 4) not in events  # bounded: it does not run away
        next(ahead)
    takes = [e for e in events if e[0] == "take"]
    assert takes == [("take", 0), ("take", 1)]
    assert events.index(("load", 2)) < events.index(("take", 1))


def test_prefetcher_hands_errors_to_the_consumer():
    def make(step):
        if step == 2:
            raise ValueError("disk on fire")
        return batch(step)

    with Prefetcher(make, lambda b: b) as ahead:
        next(ahead), next(ahead)
        with pytest.raises(ValueError, match="disk on fire"):
            next(ahead)
