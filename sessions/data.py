"""Data: bytes are tokens.

Byte-level tokens (vocabulary 256) need no tokenizer, and the arithmetic stays
visible: one token is one byte, a loss in nats per token is nats per byte.

The default corpus is the English documentation that ships inside every
CPython (`pydoc_data.topics`, about 0.5 MB), so training needs no network.
It differs by Python release (466,273 bytes on 3.11.7, 493,500 on 3.12.1,
511,947 on 3.13.0), so batches and losses do too: `describe_corpus` names it.
`--data PATH` takes a text file, a folder or a glob instead.

Batches are a pure function of (seed, step): a resumed run, another process
or a prefetch thread all get the same batch for the same step.
"""

import glob
import hashlib
import os
import platform
import time

import numpy as np

from sessions.errors import UsageError

VAL_FRACTION = 0.1  # the corpus's last tenth is held out for validation
# Past this size, several files are concatenated once into a memory-mapped
# cache instead of being held in memory.
IN_MEMORY_LIMIT = 256 * 2**20


def default_corpus():
    """CPython's bundled documentation text, as uint8 tokens."""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics))
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)


def describe_corpus(path=None):
    """One line naming the corpus: `path` as given, or for the default the
    Python release whose documentation it is and its size, e.g.
    "pydoc_data.topics (CPython 3.12.1 docs, 493,500 bytes)"."""
    if path is not None:
        return path
    python = f"{platform.python_implementation()} {platform.python_version()}"
    return f"pydoc_data.topics ({python} docs, {len(default_corpus()):,} bytes)"


def _files_for(path):
    if os.path.isdir(path):
        found = []
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            found += [os.path.join(root, f) for f in sorted(files) if not f.startswith(".")]
        return found
    if os.path.isfile(path):
        return [path]
    return sorted(p for p in glob.glob(path, recursive=True) if os.path.isfile(p))


def load_corpus(path=None, cache_dir=None):
    """All tokens of the corpus as a 1-D uint8 array (memory-mapped when large)."""
    if path is None:
        return default_corpus()
    files = _files_for(path)
    if not files:
        raise UsageError(f"{path}: no such file, folder or matching files")
    try:
        sizes = [os.path.getsize(f) for f in files]
        if sum(sizes) == 0:
            raise UsageError(f"{path}: is empty")
        if len(files) == 1:
            # A single file already is its token array: map it, copy nothing.
            return np.memmap(files[0], dtype=np.uint8, mode="r")
        if sum(sizes) <= IN_MEMORY_LIMIT:
            return np.concatenate([np.fromfile(f, dtype=np.uint8) for f in files])
        return _cached_concatenation(files, cache_dir)
    except PermissionError as e:
        raise UsageError(f"{path}: cannot read {e.filename}") from None
    except IsADirectoryError as e:
        raise UsageError(f"{path}: {e.filename} is not a file") from None


def _cached_concatenation(files, cache_dir):
    """Concatenate many files into one token file, once; map it afterwards."""
    cache_dir = cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "hpllm-jax")
    stamp = "".join(f"{f}:{os.path.getsize(f)}:{os.path.getmtime(f)};" for f in files)
    target = os.path.join(cache_dir, f"tokens-{hashlib.sha1(stamp.encode()).hexdigest()[:16]}.bin")
    if not os.path.exists(target):
        os.makedirs(cache_dir, exist_ok=True)
        partial = target + f".{os.getpid()}.partial"
        with open(partial, "wb") as out:
            for f in files:
                with open(f, "rb") as src:
                    while chunk := src.read(2**24):
                        out.write(chunk)
        os.replace(partial, target)  # atomic: a killed run leaves no half file
    return np.memmap(target, dtype=np.uint8, mode="r")


def split(tokens, seq):
    """(train, val) views of the corpus; each must hold at least one sequence."""
    n_val = int(len(tokens) * VAL_FRACTION)
    train, val = tokens[: len(tokens) - n_val], tokens[len(tokens) - n_val :]
    for name, part in (("training", train), ("validation", val)):
        if len(part) < seq + 1:
            raise UsageError(
                f"the data is too short: its {name} part holds {len(part)} bytes, "
                f"fewer than one sequence of {seq + 1}"
            )
    return train, val


def unigram_entropy(tokens, limit=2**26):
    """Nats per byte of the best model that ignores context: the byte
    frequencies. A trained model must beat this to have learned anything."""
    counts = np.bincount(np.asarray(tokens[:limit]), minlength=256).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


TRAIN, VAL = 0, 1  # independent random streams for the two splits


def get_batch(tokens, step, *, batch, seq, seed, stream=TRAIN, rows=None, delay_ms=0):
    """Batch `step` of the split: random windows, a pure function of its arguments.

    Returns {"inputs": int32 [B, S], "targets": int32 [B, S]}, targets being
    inputs shifted by one: position s learns to predict token s + 1.
    rows (a slice) keeps only some rows: a process of a multi-host run loads
    only its own part of the global batch.
    """
    if delay_ms:
        time.sleep(delay_ms / 1000)  # --data-delay-ms: pretend storage is slow
    rng = np.random.default_rng([seed, stream, step])
    starts = rng.integers(0, len(tokens) - seq, size=batch)
    if rows is not None:
        starts = starts[rows]
    windows = np.stack([np.asarray(tokens[s : s + seq + 1]) for s in starts])  # [B, S + 1]
    windows = windows.astype(np.int32)
    return {"inputs": windows[:, :-1], "targets": windows[:, 1:]}


def text_to_tokens(text):
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)


def tokens_to_text(tokens):
    return bytes(np.asarray(tokens, dtype=np.uint8).tolist()).decode("utf-8", errors="replace")
