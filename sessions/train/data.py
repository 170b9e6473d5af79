"""Data: what a run trains on, split into training and validation tokens.

Three kinds of corpus, each offline:

    docs     CPython's English documentation (`pydoc_data.topics`, about 0.5 MB):
             the CPU default, whose losses the guides quote
    stdlib   the standard library's source, 8-10 MB of Python, split by whole
             files: the GPU and TPU default, seen at most FRESH_PASSES times
    PATH     a text file, folder or glob (bytes), or nanoGPT's and llm.c's token
             files ending in .bin (sessions/train/token_files.py)

Text is read as bytes: byte-level tokens (vocabulary 256) need no tokenizer,
and a loss in nats per token is nats per byte. Token files carry a tokenizer's
ids; their vocabulary comes from --vocab.

Batches are a pure function of (seed, step): a resumed run, another process
or a prefetch thread all get the same batch for the same step.
"""

import dataclasses
import glob
import hashlib
import os
import platform
import sysconfig
import time

import numpy as np

from sessions.errors import UsageError
from sessions.train import token_files

DOCS, STDLIB = "docs", "stdlib"
VAL_FRACTION = 0.1  # a tenth is held out for validation
SPLIT_CHUNK = 10_000  # text's tenth is held out from every chunk this long (split)
IN_MEMORY_LIMIT = 256 * 2**20  # bytes past which text stays mapped, never copied into memory
# How much a run may repeat its data: three numbers, kept here and nowhere else. Repeats
# are worth nearly fresh data up to about 4 passes, fading after (Muennighoff et al. 2023,
# arXiv:2305.16264): a chip's default run (the course and gpt2-bytes presets over the stdlib)
# stays within FRESH_PASSES on every Python 3.11-3.13, the smallest stdlib seen included.
FRESH_PASSES = 4
# The header's warning, for any run: past this many passes. The cpu preset run for 1,800
# steps on the docs learns the text faster than the language from about pass 10: its gap
# then doubles while validation falls less (docs/results.md, "Passes over the data"). A
# larger model memorizes in fewer passes, so no count tells: the summary's gap does.
MAX_PASSES = 10
# Validation minus training loss, nats per token, past which the summary says the run has
# begun to memorize, if the gap also outgrew validation's fall (memorizing, run/report.py).
# The cpu preset over the stdlib, seen less than once, kept it within -0.11 to +0.09 (the
# same page). Both splits must sample the same text, as split and stdlib_corpus draw them.
MAX_GAP = 0.1


@dataclasses.dataclass(frozen=True)
class Corpus:
    name: str  # one line for the header
    train: object  # 1-D tokens: np.ndarray, np.memmap or token_files.Tokens
    val: object
    unit: str = "byte"  # what one token is: "byte", or "token" for a tokenizer's ids
    note: str | None = None  # one line when the corpus is not the one asked for

    def passes(self, tokens):
        """How many times `tokens` training tokens go over the training split."""
        return tokens / len(self.train)


def python_name():
    return f"{platform.python_implementation()} {platform.python_version()}"


def docs_text():
    """CPython's bundled documentation, as one string."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def default_corpus():
    """The docs as uint8 tokens (exercises and benches use them directly)."""
    return np.frombuffer(docs_text().encode("utf-8"), dtype=np.uint8)


# The standard library's source, without what is not the library or differs by install:
# test packages (Debian's and Docker's Pythons ship without them; they hold deliberately
# malformed files), installed packages, the codec tables in encodings/ (generated: 1.4 MB
# of `'\x80'  #  0x80 -> ...` lines), and the docs (pydoc_data), so the two stay disjoint.
STDLIB_SKIPPED = {"test", "tests", "idle_test", "site-packages", "dist-packages"}
STDLIB_SKIPPED |= {"encodings", "pydoc_data", "__pycache__"}
MIN_STDLIB_BYTES = 2**20  # less than this: the install keeps only .pyc files


def stdlib_files(root=None):
    """Sorted paths of the standard library's .py files, relative to `root`,
    with '/' separators (so the validation split is the same on every OS)."""
    root = root or sysconfig.get_paths()["stdlib"]
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in STDLIB_SKIPPED)
        rel = os.path.relpath(folder, root).replace(os.sep, "/")
        found += [f if rel == "." else f"{rel}/{f}" for f in files if f.endswith(".py")]
    return sorted(found)


def is_validation_file(rel_path):
    """A deterministic tenth of the files, chosen by a hash of each path."""
    return int(hashlib.sha256(rel_path.encode()).hexdigest(), 16) % 10 == 0


def stdlib_corpus(root=None):
    """The standard library's source, split by whole files; the docs, with a
    note, if this Python ships no sources."""
    root = root or sysconfig.get_paths()["stdlib"]
    files = stdlib_files(root) if os.path.isdir(root) else []
    parts = {False: [], True: []}  # is_validation_file -> file contents, in order
    for rel in files:
        with open(os.path.join(root, rel), "rb") as f:
            parts[is_validation_file(rel)].append(f.read())
    train, val = (np.frombuffer(b"".join(parts[v]), dtype=np.uint8) for v in (False, True))
    if len(train) + len(val) < MIN_STDLIB_BYTES:
        docs = docs_corpus()
        note = f"{python_name()} at {root} ships no .py sources (only .pyc): training on the docs"
        return dataclasses.replace(docs, note=note)
    name = (
        f"stdlib ({python_name()} source, {len(files):,} files, "
        f"{(len(train) + len(val)) / 1e6:.1f} MB; whole files held out)"
    )
    return Corpus(name, train, val)


def docs_corpus():
    tokens = default_corpus()
    held = f"a tenth of every {SPLIT_CHUNK // 1000} KB held out"
    name = f"docs (pydoc_data.topics, {python_name()}, {len(tokens):,} bytes; {held})"
    return Corpus(name, *split(tokens))


def open_corpus(spec, seq):
    """The corpus `spec` names ("docs", "stdlib", a path or glob), each split
    holding at least one sequence of `seq` + 1 tokens."""
    if spec == DOCS:
        corpus = docs_corpus()
    elif spec == STDLIB:
        corpus = stdlib_corpus()
    elif token_files.is_token_path(spec):
        found = token_files.open_token_files(spec, held_out=VAL_FRACTION)
        name = f"{spec} ({found.format}; validation: {found.val_source})"
        corpus = Corpus(name, found.train, found.val, unit="token")
    else:
        corpus = Corpus(spec, *split(load_corpus(spec)))
    check_split_lengths(corpus.train, corpus.val, seq, corpus.unit)
    return corpus


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
    cached = os.path.join(cache_dir, f"tokens-{hashlib.sha1(stamp.encode()).hexdigest()[:16]}.bin")
    if not os.path.exists(cached):
        os.makedirs(cache_dir, exist_ok=True)
        partial = cached + f".{os.getpid()}.partial"
        with open(partial, "wb") as out:
            for f in files:
                with open(f, "rb") as src:
                    while chunk := src.read(2**24):
                        out.write(chunk)
        os.replace(partial, cached)  # atomic: a killed run leaves no half file
    return np.memmap(cached, dtype=np.uint8, mode="r")


def split(tokens, seq=0):
    """(train, val): the last tenth of every chunk of about SPLIT_CHUNK tokens held out,
    so that validation samples the whole text as training does (docs/data.md: why); past
    IN_MEMORY_LIMIT, the last tenth, as views. Each holds `seq` + 1 tokens or more."""
    n, n_val = len(tokens), int(len(tokens) * VAL_FRACTION)
    chunks = max(1, n // SPLIT_CHUNK) if n <= IN_MEMORY_LIMIT else 1
    ends = np.linspace(0, n, chunks + 1).astype(int)  # the chunks' edges
    cuts = ends[1:] - np.diff(np.linspace(0, n_val, chunks + 1).astype(int))  # tails' starts
    train = [tokens[a:b] for a, b in zip(ends, cuts)]
    val = [tokens[a:b] for a, b in zip(cuts, ends[1:])]
    train, val = (p[0] if chunks == 1 else np.concatenate(p) for p in (train, val))
    check_split_lengths(train, val, seq)
    return train, val


def check_split_lengths(train, val, seq, unit="byte"):
    for name, part in (("training", train), ("validation", val)):
        if len(part) < seq + 1:
            raise UsageError(
                f"the data is too short: its {name} part holds {len(part)} {unit}s, "
                f"fewer than one sequence of {seq + 1}"
            )


def check_vocab(corpus, vocab):
    """Every token must be below the model's vocabulary: checked before step 1."""
    if corpus.unit == "byte" and vocab < 256:
        raise UsageError(f"--vocab {vocab}: the tokens of this corpus are bytes, so at least 256")
    if corpus.unit == "token":
        largest = max(corpus.train.max_token(), corpus.val.max_token())
        if largest >= vocab:
            raise UsageError(
                f"token {largest} in {corpus.name.split()[0]} is at or past --vocab {vocab}: "
                f"pass --vocab {largest + 1} or more (GPT-2's tokens: --vocab 50304)"
            )


def passes_lines(corpus, tokens, steps):
    """The header's line on how often the run sees its data, and a warning
    past MAX_PASSES naming the remedies."""
    passes = corpus.passes(tokens)
    lines = [
        f"passes: {passes:.3g} over the training split ({steps:,} steps x "
        f"{tokens // steps:,} {corpus.unit}s = {tokens / 1e6:,.3g}M)"
    ]
    if passes > MAX_PASSES:
        lines.append(
            f"warning: past {MAX_PASSES} passes a model starts to memorize its data and the "
            f"validation loss climbs; try {remedies(corpus.name)}"
        )
    return lines


def remedies(corpus_name):
    """What gives a run more data for its steps, or fewer steps for its data."""
    found = ["--data stdlib"] if corpus_name.split()[:1] != [STDLIB] else []
    return ", ".join([*found, "--data PATH (more text, or token files)", "fewer --steps"])


def unigram_entropy(tokens, limit=2**26):
    """Nats per token of the best model that ignores context: the token (byte)
    frequencies. A trained model must beat this to have learned anything."""
    counts = np.bincount(np.asarray(tokens[:limit]), minlength=256).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


TRAIN, VAL = 0, 1  # independent random streams for the two splits


def get_batch(tokens, step, *, batch, seq, seed, stream=TRAIN, rows=None, delay_ms=0):
    """Batch `step` of the split: random windows, a pure function of its arguments.

    Returns {"inputs": int32 [B, S], "targets": int32 [B, S]}, targets being
    inputs shifted by one: position s learns to predict token s + 1.
    rows (a slice or row indices, from sharding.process_rows) keeps only some
    rows: a process of a multi-host run loads only its own part of the batch.
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
