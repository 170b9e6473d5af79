"""Token files: the .bin files that nanoGPT and llm.c write, memory-mapped.

Two formats, told apart by each file's first four bytes:

- nanoGPT (`data/*/prepare.py`): `train.bin` and `val.bin`, a raw little-endian
  uint16 array with no header.
- llm.c (`dev/data/data_common.py`, also modded-nanogpt's FineWeb shards): a
  header of 256 little-endian int32, [0] a magic, [1] a version, [2] the token
  count, then the tokens: uint16 for GPT-2 (magic 20240520, version 1), uint32
  for Llama 3 (magic 20240801, version 7). llm.c's `llmc/dataloader.h` exits
  unless the file is exactly header plus tokens; so do we.

Files are mapped, never read: a 17 GB `train.bin` costs no memory until a batch
touches its pages. Validation is the file beside the training one with "train"
renamed "val" (train.bin -> val.bin, fineweb_train_*.bin -> fineweb_val_*.bin);
with none, the last tenth of the training tokens is held out, as data.py does
for text past its IN_MEMORY_LIMIT: taking a tenth of every chunk would copy them.
"""

import bisect
import glob
import os
from typing import NamedTuple

import numpy as np

from sessions.errors import UsageError

TOKEN_SUFFIX = ".bin"
HEADER_BYTES = 256 * 4  # llm.c's header: 256 int32
# magic -> (version, token dtype, format name), as llm.c's data_common.py writes them.
# A raw GPT-2 file cannot start with a magic: 20240520 is 0x0134D4C8, whose low half,
# the first uint16 token, would be 0xD4C8 = 54472, past GPT-2's 50257 ids (20240801
# likewise gives 54753). So a known magic means a shard, anything else a raw file.
SHARDS = {
    20240520: (1, np.uint16, "llm.c uint16 shards (v1)"),
    20240801: (7, np.uint32, "llm.c Llama 3 uint32 shards (v7)"),
}
RAW = "nanoGPT raw uint16"
# The files are little-endian, read here as native np.uint16/uint32: every host the
# course runs on (x86, ARM) is little-endian too.
SCAN_CHUNK = 2**24  # tokens per step of max_token's scan: 32 MB of uint16 at a time


def is_token_path(spec: str) -> bool:
    """A path or glob naming token files: it ends in .bin."""
    return spec.endswith(TOKEN_SUFFIX)


class Tokens:
    """A 1-D read-only sequence of token ids over one or more memory-mapped files, in order."""

    def __init__(self, parts, files):
        self.parts = list(parts)  # np.memmap each, already past the header
        self.files = list(files)
        self.dtype = self.parts[0].dtype
        # starts[i] is the index of parts[i]'s first token; starts[-1] the total.
        self._starts = [0]
        for part in self.parts:
            self._starts.append(self._starts[-1] + len(part))
        self._max = None

    def __len__(self) -> int:
        return self._starts[-1]

    def _pieces(self, start, stop):
        """(part, lo, hi) for each file that tokens [start, stop) touch."""
        i = bisect.bisect_right(self._starts, start) - 1  # the part holding `start`
        while start < stop:
            first, end = self._starts[i], self._starts[i + 1]
            hi = min(stop, end)
            yield i, start - first, hi - first
            start, i = hi, i + 1

    def _bounds(self, start, stop):
        # numpy's None and negative bounds; a stop before start yields no pieces
        return slice(start, stop).indices(len(self))[:2]

    def __getitem__(self, index: slice) -> np.ndarray:
        """Tokens [start:stop]: a view of the map inside one file, a copy across files."""
        if not isinstance(index, slice) or index.step not in (None, 1):
            # One token at a time from a file is slow; strided reads touch every page.
            raise TypeError(f"Tokens take contiguous slices only, not {index!r}")
        pieces = [
            self.parts[i][lo:hi]
            for i, lo, hi in self._pieces(*self._bounds(index.start, index.stop))
        ]
        if not pieces:
            return np.empty(0, dtype=self.dtype)
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def max_token(self) -> int:
        """The largest token id, scanned a chunk at a time (the model's vocabulary
        must exceed it); cached, since a scan of FineWeb reads every page once."""
        if self._max is None:
            self._max = max(
                (
                    int(p[i : i + SCAN_CHUNK].max())
                    for p in self.parts
                    for i in range(0, len(p), SCAN_CHUNK)
                ),
                default=0,
            )
        return self._max

    def take(self, start: int, stop: int) -> "Tokens":
        """Tokens [start:stop] as a Tokens over views of the same maps: nothing copied."""
        pieces = list(self._pieces(*self._bounds(start, stop)))
        if not pieces:
            return Tokens([self.parts[0][:0]], self.files[:1])
        return Tokens(
            [self.parts[i][lo:hi] for i, lo, hi in pieces], [self.files[i] for i, _, _ in pieces]
        )


class TokenSplit(NamedTuple):
    train: Tokens
    val: Tokens
    format: str  # e.g. "nanoGPT raw uint16", "llm.c uint16 shards (v1)"
    val_source: str  # the val file(s), or the held-out tenth


def _map_file(path):
    """(the file's tokens as np.memmap, its format), or UsageError saying what is wrong."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(HEADER_BYTES)
    except PermissionError:
        raise UsageError(f"{path}: cannot read it") from None
    magic = int.from_bytes(head[:4], "little", signed=True) if len(head) >= 4 else None
    if magic not in SHARDS:
        if size == 0:
            raise UsageError(f"{path}: is empty, no tokens")
        if size % 2:
            raise UsageError(f"{path}: {size:,} bytes, an odd count, cannot be uint16 tokens")
        return np.memmap(path, dtype=np.uint16, mode="r"), RAW
    version, dtype, name = SHARDS[magic]
    if size < HEADER_BYTES:
        raise UsageError(
            f"{path}: {size:,} bytes, shorter than an llm.c shard's {HEADER_BYTES}-byte header"
        )
    header = np.frombuffer(head, dtype="<i4")
    if header[1] != version:
        raise UsageError(
            f"{path}: version {header[1]} with magic {magic}; llm.c writes version {version}"
        )
    count = int(header[2])
    if count <= 0:  # dataloader.h asserts ntok > 0
        raise UsageError(f"{path}: its header says {count} tokens")
    expected = HEADER_BYTES + count * np.dtype(dtype).itemsize
    if size != expected:  # dataloader.h: "Error: file size is not as expected"
        what = "is truncated" if size < expected else "has bytes past its tokens"
        raise UsageError(
            f"{path}: {what}: its header says {count:,} tokens, {expected:,} bytes in all, "
            f"but it has {size:,}"
        )
    return np.memmap(path, dtype=dtype, mode="r", offset=HEADER_BYTES, shape=(count,)), name


def _open_all(spec, files):
    """One Tokens over the files, all of one format, and that format."""
    mapped = [_map_file(f) for f in files]
    for f, (_, fmt) in zip(files, mapped):
        if fmt != mapped[0][1]:
            raise UsageError(
                f"{f}: is {fmt}, but {files[0]} is {mapped[0][1]}; {spec} mixes formats"
            )
    return Tokens([m for m, _ in mapped], files), mapped[0][1]


def _matching(spec):
    if os.path.isfile(spec):  # a plain path, even one with [ or * in its name
        return [spec]
    return sorted(p for p in glob.glob(spec) if os.path.isfile(p))


def _val_spec(spec):
    """The spec with the last "train" of its file name renamed "val", or None."""
    folder, name = os.path.split(spec)
    at = name.rfind("train")
    if at < 0:
        return None
    return os.path.join(folder, name[:at] + "val" + name[at + len("train") :])


def open_token_files(spec: str, held_out: float = 0.1) -> TokenSplit:
    """Map the token files that `spec` (a path or a glob) names, sorted, as the
    training split, and find their validation split (see the module's docstring)."""
    files = _matching(spec)
    if not files:
        raise UsageError(f"{spec}: no such file, or no files match")
    train, fmt = _open_all(spec, files)
    val_spec = _val_spec(spec)
    val_files = _matching(val_spec) if val_spec else []
    if val_files:
        val, val_fmt = _open_all(val_spec, val_files)
        if val_fmt != fmt:
            raise UsageError(
                f"{val_files[0]}: is {val_fmt}, but {files[0]} is {fmt}; formats must match"
            )
        return TokenSplit(train, val, fmt, val_spec)
    # No val file: hold out the end, as views (data.split does so for mapped text).
    n_val = int(len(train) * held_out)
    if n_val == 0:
        raise UsageError(
            f"{spec}: {len(train)} tokens, too few to hold out {held_out:.0%} for validation"
        )
    cut = len(train) - n_val
    share = "tenth" if held_out == 0.1 else f"{held_out:.0%}"
    source = f"the last {share} of the training tokens (no val file beside them)"
    return TokenSplit(train.take(0, cut), train.take(cut, len(train)), fmt, source)
