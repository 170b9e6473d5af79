"""Session 6's tables of levers as the script prints them: one line a lever (XLA's plan
beside the napkin's, the FLOPs, the compile, the step and the loss), and what the table
shows, read from it rather than assumed."""

from sessions.plan.memory_levers import TABLE, stored

MB = 1e6


def lever_table(rows, ran, title="lever"):
    """Part 2's tables: one line a lever, named by its levers or (title "recipe") by how
    it stores the weights."""
    # FLOPs in the unit that keeps digits in the smallest row (the tiny preset's: MFLOP).
    scale, unit = (1e9, "GFLOP") if min(row.flops for _, row in rows) >= 1e10 else (1e6, "MFLOP")
    lines = [
        f"{title:<30} {'napkin MB':>10} {'XLA MB':>9} {'ratio':>6} {unit:>9} "
        f"{'compile s':>9}" + (f" {'step ms':>8} {'loss':>8}" if ran else "")
    ]
    for lever, row in rows:
        name = lever.recipe if title == "recipe" else lever.name
        xla = row.xla_bytes
        shown = f"{xla / MB:>9,.1f} {row.planned_bytes / xla:>6.2f}" if xla else f"{'refused':>16}"
        line = (
            f"{name:<30} {row.planned_bytes / MB:>10,.1f} {shown} {row.flops / scale:>9,.1f} "
            f"{row.compile_seconds:>9.1f}"
        )
        if ran:
            line += f" {row.step_seconds * 1e3:>8,.1f} {row.loss:>8.4f}"
        lines.append(line)
    lines.append(
        f"  (MB = 1e6 bytes a device; napkin MB and {unit} predicted, XLA MB compiled (XLA's "
        f"plan), compile s{', step ms and loss' if ran else ''} measured here)"
    )
    return lines


def lessons(rows):
    """What the table shows, read from it (not assumed): remat's effect unrolled and
    scanned, why (where the compiled schedule rebuilds), and whether the losses agree."""
    by = dict(rows)
    unrolled = [by[lever].xla_bytes for lever in TABLE[:3]]
    scanned = [by[lever].xla_bytes for lever in TABLE[3:6]]
    lines = []
    if None not in unrolled + scanned:
        lines.append(
            f"unrolled, XLA plans {unrolled[2] / unrolled[0]:.2f}x the bytes under block remat "
            f"as under none; scanned, {scanned[2] / scanned[0]:.2f}x"
        )
        early = by[TABLE[2]].recompute_in_forward
        lines.append(
            "unrolled, the compiled schedule rebuilds each layer "
            + (
                "during the forward: the rebuilt values live as long as saved ones would"
                if early
                else "in the backward, where remat saves memory"
            )
            + "; scanned, the rebuilding is in the backward loop's body"
        )
    losses = [row.loss for _, row in rows if row.loss is not None]
    if losses:
        spread = max(losses) - min(losses)
        lines.append(f"losses after the same steps: within {spread:.1e} of each other")
    return lines


def recipe_lessons(rows, params, on_cpu):
    """What the recipes' rows show: the state's bytes a parameter, on the napkin and in
    XLA's plan, how far each bf16 recipe's loss went from the float32 weights', and (run on
    a CPU) the bf16 dots its compiler runs in float32. A GPU's count would miss the
    matmuls it hands to cuBLAS, which are custom calls, not dots."""
    (_, f32_row), *bf16 = rows
    lines = []
    for lever, row in bf16:
        state = sum(stored(lever).bytes_per_param().values())
        more = (row.planned_bytes - f32_row.planned_bytes) / params  # a chip's share
        line = f"{lever.recipe}: {state} bytes a parameter; a chip holds {more:+.1f} on the napkin"
        if row.xla_bytes and f32_row.xla_bytes:
            line += f", {(row.xla_bytes - f32_row.xla_bytes) / params:+.1f} in XLA's plan"
        if row.loss is not None:
            line += f"; loss {row.loss - f32_row.loss:+.1e} from float32 weights'"
        lines.append(line)
    if on_cpu and f32_row.float32_dots and f32_row.float32_dots[0]:
        widened, dots = f32_row.float32_dots
        lines.append(
            f"XLA here runs {widened} of the bf16 step's {dots} dots in float32: their "
            "temporaries are float32, where the napkin counts 2 bytes"
        )
    return lines
