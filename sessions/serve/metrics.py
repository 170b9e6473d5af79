"""The server's Prometheus metrics: vLLM's names under our own prefix, in a registry of the
app's own (two servers in one process never share a count).

vLLM exports `vllm:num_requests_running`, `vllm:kv_cache_usage_perc`,
`vllm:generation_tokens_total`, `vllm:time_to_first_token_seconds`, ... (vllm/v1/metrics/
loggers.py); ours are the same names with `hpllm:`, and the KV cache in pages (used, free)
where vLLM gives a fraction. Every update comes from the engine's one thread; a scrape reads
them from the event loop's (prometheus-client's values are thread safe).
"""

import prometheus_client as prom

PREFIX = "hpllm:"
# vLLM's buckets (vllm/v1/metrics/loggers.py): a byte model on a CPU lands in the same range.
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
TPOT_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)


class ServerMetrics:
    """The gauges, counters and histograms of one server, and their text (render)."""

    def __init__(self, model_name):
        self.registry = prom.CollectorRegistry()
        labels = {"model_name": model_name}  # as vLLM labels each series

        def make(kind, name, what, **kwargs):
            metric = kind(PREFIX + name, what, list(labels), registry=self.registry, **kwargs)
            return metric.labels(**labels)

        self.running = make(prom.Gauge, "num_requests_running", "requests in the engine's slots")
        self.waiting = make(prom.Gauge, "num_requests_waiting", "requests queued for a slot")
        self.pages_used = make(prom.Gauge, "kv_pages_used", "KV cache pages held by requests")
        self.pages_free = make(prom.Gauge, "kv_pages_free", "KV cache pages on the free list")
        self.prompt_tokens = make(prom.Counter, "prompt_tokens", "prompt tokens admitted")
        self.generation_tokens = make(prom.Counter, "generation_tokens", "tokens generated")
        self.preemptions = make(prom.Counter, "num_preemptions", "requests preempted")
        self.ttft = make(
            prom.Histogram,
            "time_to_first_token_seconds",
            "from the request's arrival to its first token",
            buckets=TTFT_BUCKETS,
        )
        # vLLM's time_per_output_token_seconds: each gap between a request's tokens.
        self.tpot = make(
            prom.Histogram,
            "time_per_output_token_seconds",
            "between a request's consecutive tokens",
            buckets=TPOT_BUCKETS,
        )
        self.preempted_so_far = 0

    def engine_stats(self, stats):
        """Set the gauges from engine.stats() ({pages_total, pages_free, running, waiting,
        preemptions}), and count the preemptions since the last call."""
        self.running.set(stats["running"])
        self.waiting.set(stats["waiting"])
        self.pages_used.set(stats["pages_total"] - stats["pages_free"])
        self.pages_free.set(stats["pages_free"])
        preempted = stats.get("preemptions", 0)
        self.preemptions.inc(max(preempted - self.preempted_so_far, 0))
        self.preempted_so_far = preempted

    def render(self):
        """(body, content type) of a scrape: Prometheus' text format."""
        return prom.generate_latest(self.registry), prom.CONTENT_TYPE_LATEST
