"""How a training step's chips divide its work: tensor, sequence, data and pipeline axes,
and whether a batch of whole sequences divides over them (python -m roofline memory).

    chips = replicas x seq_shards x tp x stages

tp splits every weight matrix and the activations with an H, K, F or V axis (its every
count checked as the step's sessions/shard/sharding.py check_divisible checks it);
seq_shards splits each sequence over that many chips (context parallelism: a chip's
batch may be less than one sequence, as in the scaling book's training layouts);
replicas hold whole sequences, batch / replicas of them each; stages run L / stages
layers each (a pipeline, napkin only). A replica's sequences run as accum microbatches
one after another, or, in a pipeline, as `microbatches` of them in flight.

A chip count either has a layout that divides the batch, or it has none: then the
nearest counts that have one are named. Where --seq-shards is not given, the planner
picks the fewest sequence shards that make the batch divide, and says so.
"""

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class Layout:
    chips: int
    tp: int = 1
    seq_shards: int = 1
    stages: int = 1  # pipeline stages
    microbatches: int = 1  # a pipeline's microbatches (1 without one)
    accum: int = 1  # microbatches run one after another (gradient accumulation)
    picked: bool = False  # seq_shards chosen by the planner, not given

    @property
    def replicas(self):
        """Data-parallel replicas: groups of chips that hold whole sequences."""
        return self.chips // (self.tp * self.seq_shards * self.stages)

    @property
    def copies(self):
        """Chips that hold the same tp shard of the same stage's weights: replicas x
        seq_shards, over which ZeRO's stages divide the state and the tokens split."""
        return self.replicas * self.seq_shards

    def words(self):
        """'1,024 data x 2 sequence x 4 tensor' (and 'x P pipeline')."""
        axes = [f"{self.replicas:,} data", f"{self.seq_shards:,} sequence", f"{self.tp:,} tensor"]
        return " x ".join(axes + ([f"{self.stages} pipeline"] if self.stages > 1 else []))


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def model_problem(cfg, tp, stages):
    """Why tp or stages cannot split this model, in one line, or None: the heads, KV
    heads, ff and vocab over tp, as the step checks them; the layers over the stages."""
    for field, value in (("heads", cfg.heads), ("kv_heads", cfg.n_kv_heads), ("ff", cfg.ff),
                         ("vocab", cfg.vocab)):  # fmt: skip
        if value % tp:
            return f"--tp {tp}: {field} {value:,} does not divide over tp = {tp}"
    if cfg.layers % stages:
        return f"--pipeline-stages {stages}: {cfg.layers} layers do not divide over {stages}"
    return None


def batch_problem(cfg, layout, batch_tokens):
    """Why the batch does not divide over this layout, in one line, or None (its
    sequence shards divide the sequence: pick_layout checks them first)."""
    n = layout
    if n.chips % (n.tp * n.seq_shards * n.stages):
        return (
            f"--chips {n.chips:,}: not a multiple of tp x seq-shards x pipeline-stages "
            f"({n.tp} x {n.seq_shards} x {n.stages})"
        )
    sequences, parts = batch_tokens // cfg.seq, n.accum * n.microbatches * n.replicas
    if batch_tokens % cfg.seq or sequences % parts:
        pipe = (" x microbatches", f" x {n.microbatches}") if n.stages > 1 else ("", "")
        return (
            f"--batch-tokens {batch_tokens:,}: whole sequences of {cfg.seq:,}, as many as a "
            f"multiple of --accum{pipe[0]} x replicas ({n.accum}{pipe[1]} x {n.replicas:,})"
        )
    return None


def pick_layout(cfg, batch_tokens, chips, *, tp=1, seq_shards=None, stages=1, microbatches=1,
                accum=1):  # fmt: skip
    """The Layout of `chips`: with seq_shards, that one; without, the fewest sequence
    shards (dividing the sequence) that make whole sequences divide over the replicas.
    ValueError, one line, where none does: it names the nearest chip counts that do."""
    fixed = {"tp": tp, "stages": stages, "microbatches": microbatches, "accum": accum}
    if seq_shards and cfg.seq % seq_shards:
        raise ValueError(f"--seq-shards {seq_shards}: does not divide the sequence of {cfg.seq:,}")
    layout = _first_layout(cfg, batch_tokens, chips, seq_shards, fixed)
    if layout is None:
        why = batch_problem(cfg, Layout(chips, seq_shards=seq_shards or 1, **fixed), batch_tokens)
        raise ValueError(why + near(cfg, batch_tokens, chips, seq_shards, fixed))
    return layout


def _first_layout(cfg, batch_tokens, chips, seq_shards, fixed):
    """The given sequence sharding's Layout, or the fewest shards' that divide; None."""
    for shards in [seq_shards] if seq_shards else divisors(cfg.seq):
        layout = Layout(chips, seq_shards=shards, picked=not seq_shards and shards > 1, **fixed)
        if not batch_problem(cfg, layout, batch_tokens):
            return layout
    return None


def accepted_chips(cfg, batch_tokens, seq_shards, fixed):
    """Every chip count whose layout divides the batch (batch_tokens > 0), ascending."""
    sequences = batch_tokens // cfg.seq
    per = fixed["accum"] * fixed["microbatches"]
    if batch_tokens % cfg.seq or sequences % per:
        return []
    shards = [seq_shards] if seq_shards else divisors(cfg.seq)
    base = fixed["tp"] * fixed["stages"]
    return sorted({base * s * r for s in shards for r in divisors(sequences // per)})


def near(cfg, batch_tokens, chips, seq_shards, fixed):
    """'; nearest that divide: --chips 8,192 (...) or 10,240 (...)', or '' if none."""
    counts = accepted_chips(cfg, batch_tokens, seq_shards, fixed)
    below = [c for c in counts if c < chips][-1:]
    above = [c for c in counts if c > chips][:1]
    named = [
        f"{c:,} ({_first_layout(cfg, batch_tokens, c, seq_shards, fixed).words()})"
        for c in below + above
    ]
    return f"; nearest that divide it: --chips {' or '.join(named)}" if named else ""


def fewest_accepted(cfg, batch_tokens, at_least, seq_shards, fixed, fits):
    """The fewest chips, at least `at_least`, that the command accepts and fits(chips)
    holds for; None if none. With no batch (batch_tokens 0: the state alone) every
    multiple of tp x stages is accepted."""
    base = fixed["tp"] * fixed["stages"] * (seq_shards or 1)
    if batch_tokens == 0:
        first = base * math.ceil(at_least / base)
        return next((c for c in range(first, first + 64 * base, base) if fits(c)), None)
    counts = accepted_chips(cfg, batch_tokens, seq_shards, fixed)
    return next((c for c in counts if c >= at_least and fits(c)), None)
