"""s5_serve.py's plumbing: its flags (s3_infer.py's and its own), its tables, and the
JSON --summary-out writes."""

from roofline.flops import model_line
from roofline.hardware import CHIPS
from sessions.errors import UsageError
from sessions.model.config import PUBLISHED
from sessions.run.cli import infer_flags, infer_parser, non_negative_int

BATCHES = [1, 8, 64]  # s5's default --batches: one user, a few, many


def serve_flags(argv=None):
    """s5_serve.py's flags, parsed and checked."""
    parser = infer_parser("s5_serve.py", "Session 5: more users from the same memory.")
    parser.add_argument(
        "--train-kv-heads",
        type=non_negative_int,
        default=0,
        metavar="STEPS",
        help="train K = H, H/2 and 1 key/value heads for STEPS steps each, then serve each "
        "(0, the default: skip; 150 takes a few minutes on 2 CPU cores)",
    )
    parser.add_argument(
        "--plan",
        default="llama3-8b",
        help=f"the published model the session ends on: {', '.join(PUBLISHED)}",
    )
    parser.add_argument("--plan-chip", default="h100", help="the chip it is planned on")
    parser.set_defaults(run_dir="runs/s5")
    args = infer_flags(argv, parser)
    if args.mesh:
        raise UsageError("--mesh: s5_serve.py serves on one device (s3_infer.py takes a mesh)")
    if args.plan not in PUBLISHED:
        raise UsageError(f"--plan {args.plan}: no such published model ({', '.join(PUBLISHED)})")
    if args.plan_chip not in CHIPS:
        raise UsageError(f"--plan-chip {args.plan_chip}: no such chip (python -m roofline chips)")
    args.batches = args.batches or BATCHES
    return args


def lever_name(weights, cache):
    """("int8", "full") -> "int8 weights"; ("full", "full") -> "full precision"."""
    chosen = (("weights", weights), ("cache", cache))
    parts = [f"int8 {what}" for what, kind in chosen if kind == "int8"]
    return " + ".join(parts) or "full precision"


def quality_lines(quality, n_new, unit):
    """Each lever's validation loss (through decode, teacher-forced) beside the full
    model's, and its greedy agreement. quality: {(weights, cache): (loss, agreement)}."""
    full = quality["full", "full"][0]
    lines = [
        "quality, through the decode path: validation loss (teacher-forced, nats a "
        f"{unit}) and greedy agreement with full precision over {n_new} new {unit}s after "
        "each of 16 prompts of validation text",
        f"  {'lever':<26}{'val loss':>10}{'vs full':>10}{'agreement':>11}",
    ]
    for (w, c), (loss, agree) in quality.items():
        change = f"{100 * (loss / full - 1):+.2f}%" if (w, c) != ("full", "full") else "-"
        lines.append(f"  {lever_name(w, c):<26}{loss:>10.4f}{change:>10}{100 * agree:>10.1f}%")
    return lines


def lever_table_lines(rows):
    """Each lever at each batch beside its roofline. rows: (weights, cache, roofline
    DecodeStep, Achieved) per lever and batch."""
    lines = [
        "decode, each lever beside its roofline (MB = 1e6 bytes, read per step):",
        f"  {'lever':<26}{'batch':>6}{'weights MB':>12}{'cache MB':>10}{'tokens/s':>10}"
        f"{'MBU':>8}{'bound ms':>10}{'roof':>8}",
    ]
    for w, c, s, g in rows:
        lines.append(
            f"  {lever_name(w, c):<26}{s.batch:>6}{s.weight_bytes / 1e6:>12.2f}"
            f"{s.cache_bytes / 1e6:>10.2f}{g.tokens_per_s:>10,.0f}{100 * g.mbu:>7.1f}%"
            f"{s.step_s * 1e3:>10.3f}{s.bound:>8}"
        )
    return lines


def widening_line(copies, platform):
    """What XLA on this platform did with int8 decode (copies: roofline.compiled.widened's
    Widened ops of its program), for the reader of the table above."""
    if not copies:
        return f"XLA on this {platform} multiplies int8 as it is stored: no float copy of it"
    per_step = sum(c.runs > 1 for c in copies)
    return (
        f"XLA on this {platform} widens int8 before its dots: {len(copies) - per_step} float "
        f"copies of weights once a call, {per_step} of the cache every step, then reads those: "
        "here int8 saves memory, not time; MBU above counts the bytes stored. For a GPU "
        "or TPU, --target shows dots that read int8"
    )


def kv_heads_lines(trained, steps, unit):
    """The GQA ladder: K key/value heads trained for `steps` steps each, its validation
    loss beside its cache and its decode. trained: dicts of kv_table_row."""
    lines = [
        f"grouped-query attention, trained {steps} steps each ({model_line(trained[0]['cfg'])}):",
        f"  {'K':>3}{'val loss':>10}{'cache MB/seq':>14}{'batch':>7}{'tokens/s':>10}{'MBU':>8}",
    ]
    for t in trained:
        lines.append(
            f"  {t['kv_heads']:>3}{t['val_loss']:>10.4f}{t['cache_bytes'] / 1e6:>14.3f}"
            f"{t['batch']:>7}{t['tokens_per_second']:>10,.0f}{100 * t['mbu']:>7.1f}%"
        )
    lines.append(f"  (validation loss in nats a {unit}; the cache holds K heads of H)")
    return lines


def levers_summary(rows, quality):
    """--summary-out's `levers`: one object per lever and batch."""
    return [
        {
            "weights": w,
            "cache": c,
            "batch": s.batch,
            "tokens_per_second": g.tokens_per_s,
            "mbu": g.mbu,
            "step_seconds": g.step_s,
            "weight_bytes": s.weight_bytes,
            "cache_bytes": s.cache_bytes,
            "bound_seconds": s.step_s,
            "bound": s.bound,
            "val_loss": quality[w, c][0],
            "greedy_agreement": quality[w, c][1],
        }
        for w, c, s, g in rows
    ]
