"""A serving run's figures as a student reads them: a table, one row a (policy, rate) run,
and the latency-throughput curve across rates as a PNG (sessions/serve/latency.py's runs).
"""

import math
import os


def _ms(latency, q):
    value = latency[q]
    return "-" if value is None else f"{value * 1e3:,.1f}"


def _number(value, fmt):
    return "-" if value is None else format(value, fmt)


def _rate(rate):
    return "all" if rate is None or math.isinf(rate) else f"{rate:g}"


def runs_table_lines(runs):
    """The runs (latency.run_summary's dicts) as lines of text: a header, one row each."""
    lines = [
        f"{'policy':<10} {'rate/s':>7} {'done':>9} {'tok/s':>8} {'req/s':>7} "
        f"{'TTFT p50/p99 ms':>17} {'TPOT p50/p99 ms':>17} {'ITL p99':>8} {'E2E p99':>8} "
        f"{'goodput':>8} {'flight':>6} {'tok/st':>6} {'KV':>5} {'KV rsv':>6} {'preempt':>7}"
    ]
    for r in runs:
        kv, reserved = r["kv_utilisation_mean"], r["kv_utilisation_reserved"]
        lines.append(
            f"{r['policy']:<10} {_rate(r['rate']):>7} {r['completed']:>4}/{r['requests']:<4} "
            f"{_number(r['output_tokens_per_s'], ',.1f'):>8} "
            f"{_number(r['requests_per_s'], ',.2f'):>7} "
            f"{_ms(r['ttft_s'], 'p50') + '/' + _ms(r['ttft_s'], 'p99'):>17} "
            f"{_ms(r['tpot_s'], 'p50') + '/' + _ms(r['tpot_s'], 'p99'):>17} "
            f"{_ms(r['itl_s'], 'p99'):>8} {_ms(r['e2e_s'], 'p99'):>8} "
            f"{_number(r['goodput'], ',.2f'):>8} {_number(r['in_flight_mean'], '.1f'):>6} "
            f"{_number(r['tokens_per_step_mean'], '.1f'):>6} "
            f"{'-' if kv is None else f'{kv:.0%}':>5} "
            f"{'-' if reserved is None else f'{reserved:.0%}':>6} "
            f"{_number(r['preemptions'], 'd'):>7}"
        )
    lines.append(
        "  latencies in ms (TTFT from arrival, queueing included); tok/s and req/s over first "
        "arrival to last token; goodput: req/s within both SLOs; flight: mean requests in "
        "flight; KV: tokens held / paged capacity, KV rsv: / reserving S a running request"
    )
    return lines


def latency_throughput_chart(runs, path, title="latency against throughput"):
    """The curve as a PNG at path: per policy, each rate's output tokens/s against its TTFT
    and TPOT (p50 solid, p99 dashed), the points labelled with their rate. Returns path."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
    policies = list(dict.fromkeys(r["policy"] for r in runs))
    for colour, policy in enumerate(policies):
        own = sorted(
            (r for r in runs if r["policy"] == policy and r["output_tokens_per_s"] is not None),
            key=lambda r: r["output_tokens_per_s"],
        )
        xs = [r["output_tokens_per_s"] for r in own]
        for ax, key in zip(axes, ("ttft_s", "tpot_s")):
            for q, style in (("p50", "o-"), ("p99", "s--")):
                ys = [r[key][q] for r in own]
                if any(y is None for y in ys):
                    continue
                ax.plot(xs, ys, style, color=f"C{colour}", label=f"{policy}, {q}")
            for r, x in zip(own, xs):
                if r[key]["p99"] is not None:
                    ax.annotate(
                        _rate(r["rate"]),
                        (x, r[key]["p99"]),
                        fontsize=7,
                        textcoords="offset points",
                        xytext=(3, 3),
                    )
    for ax, name in zip(axes, ("time to first token (s)", "time per output token (s)")):
        ax.set_xlabel("output tokens/s")
        ax.set_ylabel(name)
        if all(y > 0 for line in ax.get_lines() for y in line.get_ydata()):
            ax.set_yscale("log")  # latencies span decades from below the knee to past it
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    axes[0].set_title(f"{title}: TTFT (labels: the rate offered, requests/s)", fontsize=9)
    axes[1].set_title("TPOT", fontsize=9)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path
