"""s2_train.py and s3_infer.py on token files, as a student coming from nanoGPT
or llm.c runs them: the run learns the file's pattern, prints tokens, not bytes,
and refuses a bad file or vocabulary in one line before any step."""

import json
import sys
import types
from typing import NamedTuple

import numpy as np
import pytest
from helpers import run_script

V = 1024
CYCLE = 64
# The pattern: a linear congruential sequence over 64 states with full period
# (Hull-Dobell: the increment odd, the multiplier minus one divisible by 4), each
# state x written as the id 16x + 15, so the ids spread up to 1023 = V - 1. Each
# id decides the next: a model that learns the pattern has next to no loss left,
# against the unigram baseline of ln 64 = 4.16 nats.


def lcg(n, start):
    states = [start]
    for _ in range(n - 1):
        states.append((5 * states[-1] + 1) % CYCLE)
    return np.array(states, dtype=np.uint16) * 16 + 15


def write_shard(path, tokens, magic=20240520, version=1, count=None):
    """llm.c's format, written by hand: 256 int32 of header, then the tokens."""
    header = np.zeros(256, dtype="<i4")
    header[:3] = magic, version, len(tokens) if count is None else count
    path.write_bytes(header.tobytes() + np.asarray(tokens, dtype="<u2").tobytes())


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shards")
    write_shard(folder / "lcg_train_000001.bin", lcg(20_000, 1))
    write_shard(folder / "lcg_train_000002.bin", lcg(20_000, 7))
    write_shard(folder / "lcg_val_000000.bin", lcg(4_000, 3))
    return folder


def test_a_run_on_llm_c_shards_learns_their_pattern(shards, tmp_path, capsys):
    summary = tmp_path / "summary.json"
    argv = ["--preset", "tiny", "--steps", "40", "--vocab", str(V), "--sample-bytes", "8"]
    argv += ["--data", str(shards / "lcg_train_*.bin"), "--summary-out", str(summary)]
    argv += ["--run-dir", str(tmp_path), "--checkpoint-every", "40"]
    code, out, err = run_script("sessions/s2_train.py", argv, capsys)
    assert code == 0, err
    assert "40,000 train / 4,000 val tokens" in out and "nats/token" in out
    assert "llm.c uint16 shards" in out and "lcg_val_*.bin" in out
    assert "nats/byte" not in out and " bytes" not in out.split("params + optimizer")[0]
    s = json.loads(summary.read_text())
    assert s["unigram"] == pytest.approx(np.log(CYCLE), abs=0.01)
    assert s["val_loss"] < 0.5 and s["unit"] == "token"
    # The sample is ids: the validation split's first ones, then the model's, which
    # follow the pattern (greedy enough at this loss).
    ids = [int(t) for t in out.split("token ids (")[1].split("): ", 1)[1].split("\n")[0].split()]
    assert ids[:16] == lcg(16, 3).tolist() and len(ids) == 16 + 8
    assert ids[16:] == lcg(9, (ids[15] - 15) // 16).tolist()[1:]

    # s3_infer.py reads the checkpoint's ids, never text.
    s3 = ["--checkpoint-dir", str(tmp_path / "checkpoints"), "--batches", "1"]
    s3 += ["--new-tokens", "4", "--run-dir", str(tmp_path), "--temperature", "0"]
    code, out, err = run_script("sessions/s3_infer.py", s3, capsys)
    assert code == 2 and "give --prompt as token ids" in err and "\n" not in err.strip()
    prompt = " ".join(map(str, lcg(3, 5)))
    code, out, err = run_script("sessions/s3_infer.py", [*s3, "--prompt", prompt], capsys)
    assert code == 0, err
    assert "prompt 3 tokens" in out
    expected = " ".join(map(str, lcg(7, 5)))  # greedy: the pattern goes on
    assert f"token ids (pass --tokenizer FILE to read them as text): {expected}" in out


def bad_runs(folder):
    """(argv, what the one line must say) for each bad input."""
    write_shard(folder / "big_train.bin", lcg(5_000, 1))
    write_shard(folder / "short_train.bin", lcg(5_000, 1), count=6_000)
    write_shard(folder / "v9_train.bin", lcg(5_000, 1), version=9)
    (folder / "odd.bin").write_bytes(lcg(5_000, 1).tobytes() + b"\0")
    return {
        "token-past-vocab": (
            ["--data", str(folder / "big_train.bin"), "--vocab", "1023"],
            "token 1023 in",
        ),
        "no-vocab": (["--data", str(folder / "big_train.bin")], "pass --vocab 1024 or more"),
        "odd-raw-file": (["--data", str(folder / "odd.bin"), "--vocab", "2048"], "odd"),
        "promises-more": (
            ["--data", str(folder / "short_train.bin"), "--vocab", "2048"],
            "says 6,000 tokens",
        ),
        "unknown-version": (
            ["--data", str(folder / "v9_train.bin"), "--vocab", "2048"],
            "version 9",
        ),
        "vocab-below-bytes": (
            ["--vocab", "100"],
            "--vocab 100: the tokens of this corpus are bytes",
        ),
    }


CASES = ["token-past-vocab", "no-vocab", "odd-raw-file", "promises-more"]
CASES += ["unknown-version", "vocab-below-bytes"]


@pytest.mark.parametrize("case", CASES)
def test_bad_token_input_is_one_line_before_any_step(case, tmp_path, capsys):
    argv, message = bad_runs(tmp_path)[case]
    code, out, err = run_script("sessions/s2_train.py", ["--preset", "tiny", *argv], capsys)
    assert code == 2, err
    assert message in err and err.strip().count("\n") == 0, err
    assert "compiled the train step" not in out  # refused before anything ran


class WordTokenizer:
    """A stand-in for `tokenizers.Tokenizer` with the calls sample.py makes: a
    tokenizer.json here maps each id to a word; text is words split by spaces."""

    class Encoding(NamedTuple):
        ids: list

    def __init__(self, words):
        self.words = words

    @classmethod
    def from_file(cls, path):
        with open(path) as f:
            return cls({int(k): v for k, v in json.load(f).items()})

    def encode(self, text):
        ids = {word: i for i, word in self.words.items()}
        return self.Encoding([ids[word] for word in text.split()])

    def decode(self, ids):
        return " ".join(self.words[i] for i in ids)


def test_a_given_tokenizer_reads_the_ids_as_text(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", types.SimpleNamespace(Tokenizer=WordTokenizer))
    words = tmp_path / "tokenizer.json"
    words.write_text(json.dumps({i: f"w{i}" for i in range(V)}))
    folder = tmp_path / "data"
    folder.mkdir()
    write_shard(folder / "lcg_train.bin", lcg(20_000, 1))
    argv = ["--preset", "tiny", "--steps", "40", "--vocab", str(V), "--sample-bytes", "4"]
    argv += ["--data", str(folder / "lcg_train.bin"), "--tokenizer", str(words)]
    argv += ["--prompt", " ".join(f"w{t}" for t in lcg(3, 5)), "--run-dir", str(tmp_path)]
    code, out, err = run_script("sessions/s2_train.py", argv, capsys)
    assert code == 0, err
    sample = out.split("sample:\n")[1].split("\n")[0]
    assert sample.split()[:3] == [f"w{t}" for t in lcg(3, 5)] and len(sample.split()) == 7

    # Bytes need no tokenizer; one that is not installed is named.
    code, _, err = run_script("sessions/s2_train.py", ["--tokenizer", str(words)], capsys)
    assert code == 2 and "this model's tokens are bytes" in err
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import fails
    code, _, err = run_script("sessions/s2_train.py", argv, capsys)
    assert code == 2 and "pip install tokenizers" in err


def test_a_prompt_past_the_vocabulary_is_refused(tmp_path, capsys):
    """s3_infer.py with random weights of a 100-token vocabulary cannot read the
    bytes of a text prompt ('T' is 84, 'h' 104): one line, before any timing."""
    argv = ["--random-params", "--preset", "tiny", "--vocab", "100", "--batches", "1"]
    code, out, err = run_script("sessions/s3_infer.py", [*argv, "--run-dir", str(tmp_path)], capsys)
    assert code == 2 and "the prompt holds token 116, past the vocabulary of 100" in err
    assert "session 3" not in out
