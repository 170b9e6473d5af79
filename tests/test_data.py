"""Data and the overlapped loader: batches are a pure function of (seed,
step); the prefetcher yields the synchronous loader's batches, in order,
prepared ahead of a slow consumer."""

import platform
import time

import numpy as np
import pytest

from sessions.errors import UsageError
from sessions.run.cli import resolve, train_flags
from sessions.train import data
from sessions.train.prefetch import Prefetcher, Synchronous

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


def test_split_holds_out_the_last_tenth_of_every_chunk(monkeypatch):
    """Split positions, so each part shows where it came from. In chunks of 100,
    1,000 positions give validation 90-99, 190-199, ..., 990-999 and training the
    rest, in order; 1,050 give ten chunks of 105, whose 105 held out are 10 or 11
    at the end of each. One chunk or less: the last tenth. Past IN_MEMORY_LIMIT:
    the last tenth, as views of the tokens (a mapped corpus is not copied)."""
    monkeypatch.setattr(data, "SPLIT_CHUNK", 100)
    train, val = data.split(np.arange(1000), seq=8)
    held = [p for c in range(0, 1000, 100) for p in range(c + 90, c + 100)]
    assert val.tolist() == held
    assert train.tolist() == [p for p in range(1000) if p not in held]

    train, val = data.split(np.arange(1050), seq=8)
    assert len(val) == 105 and len(train) == 945
    for c in range(0, 1050, 105):
        mine = val[(c <= val) & (val < c + 105)].tolist()
        assert len(mine) in (10, 11) and mine == list(range(c + 105 - len(mine), c + 105))

    train, val = data.split(np.arange(150), seq=8)  # one chunk
    assert val.tolist() == list(range(135, 150)) and train.tolist() == list(range(135))

    monkeypatch.setattr(data, "IN_MEMORY_LIMIT", 999)
    positions = np.arange(1000)
    train, val = data.split(positions, seq=8)
    assert val.tolist() == list(range(900, 1000)) and train.tolist() == list(range(900))
    assert np.shares_memory(train, positions) and np.shares_memory(val, positions)


def test_the_docs_hold_out_a_tenth_of_every_part():
    """Validation samples the whole docs: each tenth of them (by position) gives it
    a tenth of its bytes, give or take one chunk's held-out tail. The docs' own last
    tenth, their last topics alphabetically (types* to yield), would be all of it."""
    n = len(data.default_corpus())
    chunks = n // data.SPLIT_CHUNK
    tail = -(-int(n * 0.1) // chunks)  # the longest chunk's held-out tail: a tenth, rounded up
    _, val = data.split(np.arange(n))
    assert len(val) == int(n * 0.1)
    for tenth in range(10):
        start, end = n * tenth // 10, n * (tenth + 1) // 10
        held = np.count_nonzero((start <= val) & (val < end))
        assert abs(held - (end - start) / 10) <= tail, (tenth, held)


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


# --- the corpora: docs, stdlib, token files, and how often a run passes over them


def fake_stdlib(root, n_files=40):
    """A standard library of small .py files with unique contents, plus what
    must be left out: tests, installed packages, codec tables, the docs, and
    files that are not source. Returns {relative path: bytes} of the kept files."""
    kept = {}
    for i in range(n_files):
        rel = f"pkg{i % 3}/mod{i}.py" if i % 2 else f"mod{i}.py"
        kept[rel] = f"# {rel}\n".encode() + b"x = %d\n" % i * (i + 1)
    left_out = ["test/test_os.py", "idlelib/idle_test/t.py", "site-packages/six.py"]
    left_out += ["encodings/cp1252.py", "pydoc_data/topics.py", "pkg0/tests/t.py"]
    for rel, content in {**kept, **dict.fromkeys(left_out, b"# left out\n")}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(content)
    (root / "README.txt").write_text("# left out\n")
    (root / "mod0.pyc").write_bytes(b"# left out\n")
    return kept


def test_stdlib_holds_out_whole_files_the_same_way_every_time(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "MIN_STDLIB_BYTES", 1)
    kept = fake_stdlib(tmp_path)
    first, second = data.stdlib_corpus(str(tmp_path)), data.stdlib_corpus(str(tmp_path))
    np.testing.assert_array_equal(first.train, second.train)
    np.testing.assert_array_equal(first.val, second.val)
    train, val = first.train.tobytes(), first.val.tobytes()
    assert b"left out" not in train + val
    # Each file lies whole in exactly one split; each split is its files in sorted order.
    in_val = sorted(rel for rel, content in kept.items() if content in val)
    in_train = sorted(rel for rel, content in kept.items() if content in train)
    assert sorted(in_val + in_train) == sorted(kept)
    assert val == b"".join(kept[rel] for rel in in_val)
    assert train == b"".join(kept[rel] for rel in in_train)
    assert 1 <= len(in_val) <= 10  # about a tenth of 40
    assert "40 files" in first.name and first.unit == "byte"


def test_this_python_s_stdlib_is_split_by_file():
    corpus = data.stdlib_corpus()
    assert corpus.note is None and corpus.name.startswith("stdlib (")
    files = data.stdlib_files()
    assert "os.py" in files and "json/decoder.py" in files
    skipped = ("test", "tests", "idle_test", "site-packages", "encodings", "pydoc_data")
    assert not [f for f in files if set(f.split("/")[:-1]) & set(skipped)]
    assert 0.05 < len(corpus.val) / (len(corpus.train) + len(corpus.val)) < 0.2
    assert len(corpus.train) > 7_000_000  # about 9-10 MB on CPython 3.11-3.13


def test_a_python_without_sources_trains_on_the_docs(tmp_path):
    (tmp_path / "os.pyc").write_bytes(b"\0" * 100)
    corpus = data.stdlib_corpus(str(tmp_path))
    assert corpus.name.startswith("docs (") and "ships no .py sources" in corpus.note


def corpus_of(n_train, name="some.txt"):
    return data.Corpus(name, np.zeros(n_train, np.uint8), np.zeros(10, np.uint8))


def test_passes_in_the_header_and_a_warning_past_the_threshold():
    limit = data.MAX_PASSES * 1000  # tokens that pass over 1,000 exactly MAX_PASSES times
    (line,) = data.passes_lines(corpus_of(1000), limit, steps=10)
    assert line.startswith(f"passes: {data.MAX_PASSES} over the training split")
    lines = data.passes_lines(corpus_of(1000), limit + 10, steps=10)
    assert len(lines) == 2 and lines[1].startswith("warning:")
    assert "--data stdlib" in lines[1] and "fewer --steps" in lines[1]
    on_stdlib = data.passes_lines(corpus_of(1000, "stdlib (CPython)"), limit + 10, steps=10)
    assert "--data stdlib" not in on_stdlib[1] and "--data PATH" in on_stdlib[1]


# Training-split sizes, measured on CPython's own builds (pyenv): the docs and the
# stdlib as data.py cuts them. The row of the Python running the test is checked
# against its real corpora below, so the table cannot drift from the code. A
# distribution's Python ships part of the library in other packages, so its row
# is named for where it was seen and never matched to the Python running the test.
TRAIN_SPLIT = {
    "3.11.7": {"docs": 419_646, "stdlib": 8_857_769},
    "3.12.1": {"docs": 444_150, "stdlib": 8_322_187},
    "3.13.0": {"docs": 460_753, "stdlib": 8_124_289},
    # The smallest stdlib seen: the H100 machine's Python (393 files, 8.0 MB), from
    # the header of its accelerator check's log (docs/h100-run/accelerator-check/s2.log).
    "3.12.3 on the H100": {"stdlib": 7_044_568},
}
DEFAULT_PLATFORM = {"tiny": "cpu", "cpu": "cpu", "course": "gpu", "gpt2-bytes": "gpu"}


@pytest.mark.parametrize("preset", sorted(DEFAULT_PLATFORM))
def test_every_preset_s_default_run_stays_below_the_threshold(preset):
    """A CPU preset's default run stays under the warning over the docs; a chip's
    (GPU or TPU) within the passes that are worth nearly fresh data, over the
    stdlib, on every Python measured."""
    platform_here = DEFAULT_PLATFORM[preset]
    run = resolve(train_flags(["--preset", preset]), platform=platform_here)
    assert run.data == ("docs" if platform_here == "cpu" else "stdlib")
    assert resolve(train_flags(["--preset", preset]), platform="tpu").data == run.data or (
        platform_here == "cpu"  # a TPU, like a GPU, gets the stdlib
    )
    bound = data.MAX_PASSES if platform_here == "cpu" else data.FRESH_PASSES
    tokens = run.train.steps * run.train.batch * run.model.seq
    sizes = {python: size[run.data] for python, size in TRAIN_SPLIT.items() if run.data in size}
    here = platform.python_version()
    if platform.python_implementation() == "CPython" and here in sizes:
        assert len(data.open_corpus(run.data, run.model.seq).train) == sizes[here]
    for python, size in sizes.items():
        passes = tokens / size
        assert passes <= bound, (python, preset, run.data, passes)


def test_a_batch_of_token_files_is_the_batch_of_their_tokens_in_memory(tmp_path):
    """Mapped shards give the same batches as the same tokens held in memory, and
    a process of a multi-host run cuts exactly its rows of them."""
    tokens = np.random.default_rng(0).integers(0, 50257, 3_000, dtype=np.uint16)
    for i, part in enumerate(np.split(tokens, [1_000, 2_200])):
        header = np.zeros(256, "<i4")
        header[:3] = 20240520, 1, len(part)
        (tmp_path / f"x_train_{i}.bin").write_bytes(header.tobytes() + part.tobytes())
    corpus = data.open_corpus(str(tmp_path / "x_train_*.bin"), seq=16)
    assert len(corpus.train) == 2_700 and corpus.unit == "token"
    in_memory = tokens[:2_700]
    for step in (0, 5):
        mapped = data.get_batch(corpus.train, step, batch=8, seq=16, seed=3)
        held = data.get_batch(in_memory, step, batch=8, seq=16, seed=3)
        np.testing.assert_array_equal(mapped["inputs"], held["inputs"])
        mine = data.get_batch(corpus.train, step, batch=8, seq=16, seed=3, rows=slice(4, 8))
        np.testing.assert_array_equal(mine["targets"], held["targets"][4:8])
    assert held["inputs"].max() > 256  # ids, not bytes
