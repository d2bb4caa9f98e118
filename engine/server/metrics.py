"""Prometheus metrics under vLLM's names (``vllm:*``), so dashboards and load generators built for vLLM read ours.

Kept by the server's process (as vLLM's frontend keeps them), fed from the engine process's per-step
messages: the gauges and counters from each step's ``StepStats``, the latency histograms from each
finished choice's engine-clock times. The engine loop does no metrics work of its own. Each server has
its own registry (no process-wide globals).
"""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Buckets follow vLLM's (seconds; tokens), so histograms line up with a vLLM deployment's.
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                  20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                 40.0, 80.0)
REQUEST_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                     240.0, 480.0, 960.0, 1920.0, 7680.0)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)


# vLLM's finished_reason labels where ours differ (the limits that cut an output count as "length", as there).
_VLLM_REASONS = {"aborted": "abort", "max_model_len": "length", "kv_capacity": "length", "token_budget": "length"}


class ServerMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = registry = CollectorRegistry(auto_describe=True)
        self._model = model_name
        labels = ["model_name"]
        m = {"model_name": model_name}

        def counter(name, doc):
            return Counter(name, doc, labels, registry=registry).labels(**m)

        def histogram(name, doc, buckets):
            return Histogram(name, doc, labels, buckets=buckets, registry=registry).labels(**m)

        def gauge(name, doc):
            return Gauge(name, doc, labels, registry=registry).labels(**m)

        self.running = gauge("vllm:num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = full).")
        self.prefix_queries = counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prompt tokens served from the prefix cache.")
        self.preemptions = counter("vllm:num_preemptions", "Requests preempted (recomputed later).")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens of finished requests.")
        self.generation_tokens = counter("vllm:generation_tokens", "Tokens generated.")
        self._success = Counter("vllm:request_success", "Requests finished, by reason.",
                                ["model_name", "finished_reason"], registry=registry)
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS_S)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Time between consecutive tokens.", ITL_BUCKETS_S)
        self.tpot = histogram("vllm:request_time_per_output_token_seconds",
                              "Per request: (E2E - TTFT) / (output tokens - 1).", ITL_BUCKETS_S)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "From arrival to the last token.",
                             REQUEST_BUCKETS_S)
        self.queue = histogram("vllm:request_queue_time_seconds", "From arrival to first scheduled.",
                               REQUEST_BUCKETS_S)
        # vLLM's phases of a request after its queue time (its Grafana dashboard's "prefill and decode time" panel
        # reads two of them; it stayed empty here). Preemptions count in the phase they fall in, as there.
        self.prefill_time = histogram("vllm:request_prefill_time_seconds", "From first scheduled to the first token.",
                                      REQUEST_BUCKETS_S)
        self.decode_time = histogram("vllm:request_decode_time_seconds", "From the first token to the last.",
                                     REQUEST_BUCKETS_S)
        self.inference_time = histogram("vllm:request_inference_time_seconds",
                                        "From first scheduled to the last token.", REQUEST_BUCKETS_S)
        self.prompt_len = histogram("vllm:request_prompt_tokens", "Prompt tokens per request.", TOKEN_BUCKETS)
        self.output_len = histogram("vllm:request_generation_tokens", "Generated tokens per request.",
                                    TOKEN_BUCKETS)
        self.iteration_tokens = histogram("vllm:iteration_tokens_total", "Tokens computed per engine step.",
                                          TOKEN_BUCKETS)
        self._seen_queries = self._seen_hits = 0

    def on_step(self, stats, num_generated: int) -> None:
        """A step's ``engine_process.StepStats`` and the tokens it sampled for this server's requests."""
        self.running.set(stats.num_running)
        self.waiting.set(stats.num_waiting)
        self.kv_usage.set(stats.kv_usage)
        if stats.num_batched_tokens:
            self.iteration_tokens.observe(stats.num_batched_tokens)
        if stats.num_preempted:
            self.preemptions.inc(stats.num_preempted)
        if num_generated:
            self.generation_tokens.inc(num_generated)
        if stats.num_queried_tokens > self._seen_queries:
            self.prefix_queries.inc(stats.num_queried_tokens - self._seen_queries)
            self.prefix_hits.inc(stats.num_hit_tokens - self._seen_hits)
            self._seen_queries, self._seen_hits = stats.num_queried_tokens, stats.num_hit_tokens

    def on_aborted(self, num_choices: int, reason: str = "abort") -> None:
        """Choices the server ended: their client went away (vLLM counts them under finished_reason="abort"), or a
        stop string ended them ("stop", as vLLM, whose engine checks stop strings itself)."""
        self._success.labels(model_name=self._model, finished_reason=reason).inc(num_choices)

    def on_engine_stopped(self, num_failed: int) -> None:
        """The engine process stopped: nothing runs, waits or holds blocks any more, and the ``num_failed`` choices it
        had not finished count as errors (as one the engine failed itself)."""
        self.running.set(0)
        self.waiting.set(0)
        self.kv_usage.set(0)
        if num_failed:
            self._success.labels(model_name=self._model, finished_reason="error").inc(num_failed)

    def on_finished(self, update) -> None:
        """A finished choice's update (with its ``timing``)."""
        reason = update.finish_reason or "unknown"
        self._success.labels(model_name=self._model, finished_reason=_VLLM_REASONS.get(reason, reason)).inc()
        self._observe(update.num_prompt_tokens, update.timing)

    def on_ended_by_stop_string(self, num_prompt_tokens: int, timing, num_tokens: int) -> None:
        """A choice a stop string ended after ``num_tokens`` tokens (counted under "stop" by on_aborted): a finished
        request, as in vLLM. It was left out of every metric but request_success: prompt tokens, TTFT, e2e latency,
        lengths. Its tokens past ``num_tokens`` (run before the abort landed) were never served."""
        if timing is not None:
            timing = SimpleNamespace(arrival_s=timing.arrival_s, first_scheduled_s=timing.first_scheduled_s,
                                     token_times_s=timing.token_times_s[:num_tokens])
        self._observe(num_prompt_tokens, timing)

    def _observe(self, num_prompt_tokens: int, timing) -> None:
        self.prompt_tokens.inc(num_prompt_tokens)
        self.prompt_len.observe(num_prompt_tokens)
        if timing is None:
            return
        times = timing.token_times_s
        self.output_len.observe(len(times))
        if timing.first_scheduled_s is not None:
            self.queue.observe(max(timing.first_scheduled_s - timing.arrival_s, 0.0))
        if not times:
            return
        self.ttft.observe(max(times[0] - timing.arrival_s, 0.0))
        observe = self.itl.observe
        for previous, current in zip(times, times[1:]):
            observe(current - previous)
        if len(times) > 1:
            self.tpot.observe((times[-1] - times[0]) / (len(times) - 1))
        self.e2e.observe(max(times[-1] - timing.arrival_s, 0.0))
        self.decode_time.observe(times[-1] - times[0])
        if timing.first_scheduled_s is not None:
            self.prefill_time.observe(max(times[0] - timing.first_scheduled_s, 0.0))
            self.inference_time.observe(max(times[-1] - timing.first_scheduled_s, 0.0))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
