"""Token files: nanoGPT's raw uint16 and llm.c's shards read back exactly as
written, memory-mapped; validation found beside them or held out; every bad
file a one-line UsageError naming it.

The files are written here byte by byte (struct and numpy), never by the code
under test, so a wrong header offset or dtype cannot cancel itself out.
"""

import struct

import numpy as np
import pytest

from sessions.errors import UsageError
from sessions.train import token_files
from sessions.train.token_files import Tokens, is_token_path, open_token_files

GPT2, LLAMA3 = (20240520, 1, "<u2"), (20240801, 7, "<u4")


def write_raw(path, tokens):
    path.write_bytes(np.asarray(tokens, dtype="<u2").tobytes())
    return np.asarray(tokens, dtype=np.uint16)


def write_shard(path, tokens, kind=GPT2, count=None, version=None):
    """An llm.c shard: 256 int32 (magic, version, token count, zeros), then the tokens.
    count and version, when given, lie about the tokens that follow."""
    magic, right_version, dtype = kind
    n = len(tokens) if count is None else count
    header = struct.pack(
        "<256i", magic, right_version if version is None else version, n, *[0] * 253
    )
    path.write_bytes(header + np.asarray(tokens, dtype=dtype).tobytes())
    return np.asarray(tokens, dtype=dtype)


def shards(folder, sizes, name="fw_train", kind=GPT2, seed=0):
    """Shards name_000000.bin ... of the given sizes, random tokens; their concatenation."""
    rng = np.random.default_rng(seed)
    high = 50257 if kind == GPT2 else 128256
    arrays = [
        write_shard(folder / f"{name}_{i:06d}.bin", rng.integers(0, high, n), kind)
        for i, n in enumerate(sizes)
    ]
    return np.concatenate(arrays)


def test_is_token_path():
    assert is_token_path("data/train.bin") and is_token_path("fineweb10B/fineweb_train_*.bin")
    assert not is_token_path("notes.txt") and not is_token_path("data/")


def test_nanogpt_train_and_val_read_back_exactly(tmp_path):
    train = write_raw(tmp_path / "train.bin", [50256, 0, 1, 65535, 464, 3290, 7])
    val = write_raw(tmp_path / "val.bin", [11, 12, 13])
    split = open_token_files(str(tmp_path / "train.bin"))
    assert split.format == "nanoGPT raw uint16"
    assert split.val_source == str(tmp_path / "val.bin")
    assert split.train.dtype == np.uint16 and split.val.dtype == np.uint16
    assert len(split.train) == 7 and len(split.val) == 3
    np.testing.assert_array_equal(split.train[:], train)
    np.testing.assert_array_equal(split.val[:], val)
    assert split.train.files == [str(tmp_path / "train.bin")]
    # mapped, never read: each part is a np.memmap of its file
    assert all(isinstance(p, np.memmap) for p in split.train.parts + split.val.parts)


def test_llm_c_glob_finds_its_val_shard(tmp_path):
    train = shards(tmp_path, [5, 7, 4])
    (tmp_path / "fw_train_folder.bin").mkdir()  # matches, but is no file: skipped
    val = write_shard(tmp_path / "fw_val_000000.bin", [9, 8, 7, 65535])
    split = open_token_files(str(tmp_path / "fw_train_*.bin"))
    assert split.format == "llm.c uint16 shards (v1)"
    assert split.val_source == str(tmp_path / "fw_val_*.bin")
    assert split.train.files == [str(tmp_path / f"fw_train_{i:06d}.bin") for i in range(3)]
    assert split.train.dtype == np.uint16 and len(split.train) == 16
    np.testing.assert_array_equal(split.train[:], train)
    np.testing.assert_array_equal(split.val[:], val)
    assert all(isinstance(p, np.memmap) for p in split.train.parts)
    assert all(p.offset == 1024 for p in split.train.parts)  # past the header


def test_llama3_shards_are_uint32(tmp_path):
    train = write_shard(
        tmp_path / "tiny_shakespeare_train.bin", [128000, 70000, 1, 2**32 - 1], LLAMA3
    )
    val = write_shard(tmp_path / "tiny_shakespeare_val.bin", [128001, 5], LLAMA3)
    split = open_token_files(str(tmp_path / "tiny_shakespeare_train.bin"))
    assert split.format == "llm.c Llama 3 uint32 shards (v7)"
    assert split.train.dtype == np.uint32 and len(split.train) == 4
    np.testing.assert_array_equal(split.train[:], train)
    np.testing.assert_array_equal(split.val[:], val)
    assert split.train.max_token() == 2**32 - 1


def test_every_slice_inside_and_across_shards(tmp_path):
    known = shards(tmp_path, [5, 1, 7, 4])
    write_shard(tmp_path / "fw_val_000000.bin", [1])  # so that all 17 are training tokens
    tokens = open_token_files(str(tmp_path / "fw_train_*.bin")).train
    n = len(tokens)
    bounds = [None, *range(-n - 2, n + 3)]
    for start in bounds:
        for stop in bounds:
            got = tokens[start:stop]
            assert got.dtype == np.uint16
            np.testing.assert_array_equal(got, known[start:stop], err_msg=f"[{start}:{stop}]")
    # across three shards, a boundary on each side
    np.testing.assert_array_equal(tokens[4:14], known[4:14])
    # inside one file: a view of its map, no copy
    inside = tokens[6:13]
    assert isinstance(inside, np.memmap) and np.shares_memory(inside, tokens.parts[2])


def test_single_tokens_and_steps_are_refused(tmp_path):
    write_raw(tmp_path / "a.bin", range(10))
    tokens = open_token_files(str(tmp_path / "a.bin")).train
    for index in (3, slice(0, 8, 2), slice(None, None, -1)):
        with pytest.raises(TypeError):
            tokens[index]
    np.testing.assert_array_equal(tokens[2:5:1], [2, 3, 4])


def test_max_token_scans_in_chunks_and_is_cached(tmp_path, monkeypatch):
    monkeypatch.setattr(token_files, "SCAN_CHUNK", 3)  # chunks that split every shard
    write_shard(tmp_path / "x_val_0.bin", [2000])  # not scanned: it is another split
    write_shard(tmp_path / "x_train_0.bin", [1, 2, 900, 4, 5])  # max ends the first chunk
    tokens = open_token_files(str(tmp_path / "x_train_*.bin")).train
    assert tokens.max_token() == 900
    write_shard(tmp_path / "x_train_1.bin", [6, 7, 8, 9, 1000])  # max is the last token
    tokens = open_token_files(str(tmp_path / "x_train_*.bin")).train
    assert tokens.max_token() == 1000
    tokens.parts = []  # a second call must not scan again
    assert tokens.max_token() == 1000


@pytest.mark.parametrize(
    ("sizes", "val_files"),
    [([50], 1), ([20, 2], 1), ([19, 11], 1), ([25, 3, 2], 2)],
    ids=["one-file", "cut-on-a-boundary", "inside-a-shard", "across-shards"],
)
def test_without_a_val_file_the_last_tenth_is_held_out(tmp_path, sizes, val_files):
    known = shards(tmp_path, sizes, name="corpus")  # no "train" in the name
    split = open_token_files(str(tmp_path / "corpus_*.bin"))
    n_val = len(known) // 10
    assert len(split.train) + len(split.val) == len(known) and len(split.val) == n_val
    np.testing.assert_array_equal(split.train[:], known[:-n_val])
    np.testing.assert_array_equal(split.val[:], known[-n_val:])
    assert split.val_source == "the last tenth of the training tokens (no val file beside them)"
    assert len(split.val.files) == val_files
    # held out by views of the same maps, nothing copied
    assert all(isinstance(p, np.memmap) for p in split.train.parts + split.val.parts)
    files = sorted(str(f) for f in tmp_path.glob("corpus_*.bin"))
    assert split.val.files == files[-val_files:]


def test_train_named_without_a_val_beside_it_holds_out_too(tmp_path):
    known = write_raw(tmp_path / "train.bin", range(30))
    split = open_token_files(str(tmp_path / "train.bin"))
    np.testing.assert_array_equal(split.val[:], known[27:])
    assert "last tenth" in split.val_source


def test_only_the_last_train_of_the_file_name_becomes_val(tmp_path):
    (tmp_path / "train").mkdir()  # the folder's "train" stays
    write_raw(tmp_path / "train" / "pretrain_train.bin", range(10))
    val = write_raw(tmp_path / "train" / "pretrain_val.bin", [3, 1, 4])
    write_raw(tmp_path / "train" / "preval_train.bin", [9, 9])  # had the first been renamed
    split = open_token_files(str(tmp_path / "train" / "pretrain_train.bin"))
    assert split.val_source == str(tmp_path / "train" / "pretrain_val.bin")
    np.testing.assert_array_equal(split.val[:], val)


def test_take_is_a_tokens_over_the_same_maps(tmp_path):
    known = shards(tmp_path, [4, 6, 5])
    write_shard(tmp_path / "fw_val_000000.bin", [1])
    tokens = open_token_files(str(tmp_path / "fw_train_*.bin")).train
    part = tokens.take(2, 12)
    assert isinstance(part, Tokens) and len(part) == 10
    np.testing.assert_array_equal(part[:], known[2:12])
    np.testing.assert_array_equal(part[3:9], known[5:11])
    assert part.files == tokens.files
    assert all(isinstance(p, np.memmap) for p in part.parts)
    assert np.shares_memory(part.parts[1], tokens.parts[1])
    assert len(tokens.take(5, 5)) == 0 and len(tokens[7:3]) == 0


# Each bad input below is otherwise good (a good val file beside it where one is
# read), so that only the check it is for can catch it; `why` is that check's word.


def missing(tmp):
    return tmp / "nope_train.bin", "nope_train.bin", "no such file"


def unmatched_glob(tmp):
    return tmp / "fw_train_*.bin", "fw_train_*.bin", "no files match"


def empty(tmp):
    (tmp / "train.bin").write_bytes(b"")
    write_raw(tmp / "val.bin", range(4))
    return tmp / "train.bin", "train.bin", "empty"


def odd_bytes(tmp):
    (tmp / "train.bin").write_bytes(b"\x01\x00\x02\x00\x03")
    write_raw(tmp / "val.bin", range(4))
    return tmp / "train.bin", "train.bin", "odd"


def gpt2_shard(tmp, tokens=range(20), **lie):
    write_shard(tmp / "s_train_0.bin", tokens, **lie)
    write_shard(tmp / "s_val_0.bin", range(4), lie.get("kind", GPT2))
    return tmp / "s_train_*.bin", "s_train_0.bin"


def truncated(tmp):
    return *gpt2_shard(tmp, count=21), "truncated"


def bytes_past_tokens(tmp):
    return *gpt2_shard(tmp, count=19), "bytes past its tokens"


def llama3_sized_as_uint16(tmp):
    # 10 tokens promised, 20 bytes of them: uint16's size, not uint32's
    spec, named = gpt2_shard(tmp, tokens=range(10), kind=LLAMA3)
    (tmp / named).write_bytes((tmp / named).read_bytes()[:-20])
    return spec, named, "truncated"


def zero_tokens(tmp):
    return *gpt2_shard(tmp, tokens=[]), "says 0 tokens"


def negative_count(tmp):
    return *gpt2_shard(tmp, tokens=[], count=-3), "says -3 tokens"


def unknown_version(tmp):
    return *gpt2_shard(tmp, version=2), "version 2"


def llama3_magic_with_gpt2_version(tmp):
    return *gpt2_shard(tmp, kind=LLAMA3, version=1), "version 1"


def shorter_than_header(tmp):
    (tmp / "s_train_0.bin").write_bytes(struct.pack("<3i", 20240520, 1, 10) + bytes(20))
    write_shard(tmp / "s_val_0.bin", range(4))
    return tmp / "s_train_0.bin", "s_train_0.bin", "1024-byte header"


def mixed_shards(tmp):
    write_shard(tmp / "s_train_0.bin", range(20))
    write_raw(tmp / "s_train_1.bin", range(20))
    return tmp / "s_train_*.bin", "s_train_1.bin", "mixes formats"


def val_of_another_format(tmp):
    write_raw(tmp / "train.bin", range(40))
    write_shard(tmp / "val.bin", range(4))
    return tmp / "train.bin", "val.bin", "formats must match"


def bad_val_file(tmp):
    write_raw(tmp / "train.bin", range(40))
    (tmp / "val.bin").write_bytes(b"\x01\x00\x02")
    return tmp / "train.bin", "val.bin", "odd"


def too_few_to_hold_out(tmp):
    write_raw(tmp / "tiny.bin", range(9))
    return tmp / "tiny.bin", "tiny.bin", "too few"


@pytest.mark.parametrize(
    "bad",
    [
        missing,
        unmatched_glob,
        empty,
        odd_bytes,
        truncated,
        bytes_past_tokens,
        llama3_sized_as_uint16,
        zero_tokens,
        negative_count,
        unknown_version,
        llama3_magic_with_gpt2_version,
        shorter_than_header,
        mixed_shards,
        val_of_another_format,
        bad_val_file,
        too_few_to_hold_out,
    ],
)
def test_bad_input_is_one_line_naming_the_file(tmp_path, bad):
    spec, named, why = bad(tmp_path)
    with pytest.raises(UsageError) as caught:
        open_token_files(str(spec))
    message = str(caught.value)
    assert named in message and why in message and "\n" not in message, message
