"""What s7_engine.py prints beside its runs: the napkin's predictions, the step's
measurements, the two policies' ratio, the pages, and Little's law along the curve.
Each line says whether its figure is predicted (a napkin) or measured (this machine)."""


def napkin_lines(predicted, slots, page_size, context):
    """The predictions (s7_engine.py's `predicted` dict), before anything runs."""
    p = predicted
    return [
        "predicted (napkin, roofline/plan/batching.py):",
        f"  continuous / static at saturation: E[max of {slots} outputs] / E[G] = "
        f"{p['continuous_over_static']:.2f}x (steps of one time, free prefill, an endless queue)",
        f"  the pool holds {p['sequences_paged']} of these requests paged (first come, first "
        f"served), {p['sequences_reserved']} reserving {context} positions each; tokens / "
        f"capacity {p['kv_utilisation_paged']:.0%} paged in pages of {page_size}, "
        f"{p['kv_utilisation_reserved']:.0%} reserved",
        f"  decode step at B = {slots}: at least {p['decode_step_floor_s'] * 1e3:.3f} ms "
        f"(session 3's roofline at this machine's roofs); through XLA's gather the pages' "
        f"bytes move 3 times: {p['paged_over_contiguous']:.2f}x the contiguous step's floor",
        f"  the knee: at most {p['knee_roofline_requests_per_s']:,.0f} requests/s (B / (G·step) "
        "at the roofline's step, prefill free)",
    ]


def step_lines(share, predicted, knee, slots):
    """The engine's step measured (sessions/serve/host_share.py's dict) beside the napkin."""
    paged, contiguous = share["device_s"], share["contiguous_s"]
    return [
        "measured (this machine): the step",
        f"  paged decode step at B = {slots}: {paged * 1e3:.3f} ms of device work, "
        f"{share['step_s'] * 1e3:.3f} ms through the engine: the host adds "
        f"{share['host_fraction']:.0%} (its own thread: {share['host_cpu_s'] * 1e3:.2f} ms a step)",
        f"  session 3's contiguous step {contiguous * 1e3:.3f} ms: paged / contiguous "
        f"{paged / contiguous:.2f}x measured, {predicted['paged_over_contiguous']:.2f}x predicted "
        f"(the floors); a prefill chunk {share['chunk_s'] * 1e3:.3f} ms",
        f"  the knee, from these: {knee:.1f} requests/s (B / (G·step + B·prefill): slots "
        "refilled at once, each prefill stalling every slot)",
    ]


def comparison_lines(static, continuous, predicted, with_prefill):
    """Continuous against static on one stream (two run dicts), beside the napkin's ratio."""
    got = continuous["output_tokens_per_s"] / static["output_tokens_per_s"]
    ratio = predicted["continuous_over_static"]
    return [
        f"  continuous / static, output tokens/s: {got:.2f}x measured; predicted {ratio:.2f}x "
        f"with free prefill (measured {got / ratio:.0%} of it), {with_prefill:.2f}x with each "
        "prefill's measured cost stalling the slots"
    ]


def pages_lines(run, wait, same, checked):
    """A run's pages, the host's gap between steps, and the same-tokens check."""
    return [
        f"  pages: {run['kv_utilisation_mean']:.0%} of the pages in use held tokens (mean over "
        f"steps); reserving whole contexts, {run['kv_utilisation_reserved']:.0%}; preemptions "
        f"{run['preemptions']}",
        f"  the host's gap between steps: {wait['host_fraction']:.1%} of the steps' time",
        f"  the same tokens: {same} of {checked} requests got generate()'s greedy tokens for "
        f"each alone; near-ties (top two logits within the dtype's threshold): {run['near_ties']}",
    ]


def little_lines(runs, knee):
    """Little's law along the curve: in flight = throughput x mean latency, measured both
    ways; and the most each policy carried, against the knee."""
    lines = []
    for run in runs:
        little = run["requests_per_s"] * run["e2e_mean_s"]
        lines.append(
            f"  {run['policy']:<10} at {run['rate']:>7g}/s: {run['in_flight_mean']:6.2f} in flight "
            f"(time-weighted), Little's law {little:6.2f}: x{run['in_flight_mean'] / little:.2f}"
        )
    best = max(run["requests_per_s"] for run in runs if run["policy"] == runs[-1]["policy"])
    lines.append(
        f"  {runs[-1]['policy']} carried at most {best:.1f} requests/s: {best / knee:.0%} of the "
        f"knee predicted from the step's times ({knee:.1f})"
    )
    return lines
