"""The workers' counters in the router's /metrics exposition (router/metrics.py's collector)."""

from engine.worker_stats import WorkerLoad
from router.metrics import RouterMetrics


def _exported(prefix: str, **counters) -> dict[str, str]:
    """The exposition's lines starting with ``prefix``, by metric name, for one decode worker's
    load report with ``counters`` set."""
    load = WorkerLoad(
        "decode-0",
        "inc",
        "decode",
        num_running=3,
        num_waiting=2,
        num_free_blocks=1,
        num_total_blocks=65,
        queued_prefill_tokens=0,
        **counters,
    )
    text = RouterMetrics("m", loads=lambda: [load]).exposition()[0].decode()
    return {line.split("{")[0]: line for line in text.splitlines() if line.startswith(prefix)}


def test_preemptions_are_exported_per_worker():
    """A cluster under KV pressure preempted requests, and nothing in /metrics or the logs showed it."""
    lines = _exported("baton_worker_preempt", preemptions=17, preempted_tokens=2803)
    assert lines["baton_worker_preemptions_total"].endswith(" 17.0")
    assert lines["baton_worker_preempted_tokens_total"].endswith(" 2803.0")
    assert 'worker="decode-0"' in lines["baton_worker_preemptions_total"]


def test_speculative_decodings_drafts_and_kept_drafts_are_exported_per_worker():
    lines = _exported("baton_spec_", draft_tokens=400, accepted_draft_tokens=310)
    assert lines["baton_spec_draft_tokens_total"].endswith(" 400.0")
    assert lines["baton_spec_accepted_tokens_total"].endswith(" 310.0")
    assert 'role="decode"' in lines["baton_spec_accepted_tokens_total"]
