"""The benchmark's reading of vLLM's /metrics text."""

from benchmarks.routing_bench.fleet import HITS, PREEMPTIONS, QUERIES, RUNNING, parse_metrics


def test_parse_metrics_sums_label_sets_and_ignores_the_rest() -> None:
    text = "\n".join(
        [
            "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.",
            "# TYPE vllm:num_preemptions_total counter",
            'vllm:num_preemptions_total{engine="0",model_name="m"} 3.0',
            'vllm:num_preemptions_total{engine="1",model_name="m"} 2.0',
            'vllm:num_requests_running{engine="0",model_name="m"} 7.0',
            'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 160.0',
            'vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e9',
            "process_cpu_seconds_total 12.0",
            'vllm:prefix_cache_queries_total{engine="0"} not-a-number',
        ]
    )
    m = parse_metrics(text)
    assert m[PREEMPTIONS] == 5.0
    assert m[RUNNING] == 7.0
    assert m[HITS] == 160.0
    assert m[QUERIES] == 0.0
