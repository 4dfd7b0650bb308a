"""The metrics exposition: counts by outcome, cumulative latency buckets, certificate expiry."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from runtime_hook.contract import VERSION
from webhook.metrics import Metrics


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.render().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_reviews_are_counted_by_outcome_and_latency_is_bucketed_cumulatively() -> None:
    metrics = Metrics(lambda: 3600.0)
    for outcome, seconds in [("patched", 0.0001), ("patched", 0.0004), ("denied", 0.003),
                             ("invalid", 2.0)]:
        metrics.observe(outcome, seconds)
    found = samples(metrics)
    assert found[("vcuda_webhook_reviews_total", (("decision", "patched"),))] == 2
    assert found[("vcuda_webhook_reviews_total", (("decision", "allowed"),))] == 0
    assert found[("vcuda_webhook_reviews_total", (("decision", "invalid"),))] == 1
    bucket = "vcuda_webhook_review_seconds_bucket"
    assert found[(bucket, (("le", "0.0002"),))] == 1
    assert found[(bucket, (("le", "0.0005"),))] == 2
    assert found[(bucket, (("le", "0.005"),))] == 3
    assert found[(bucket, (("le", "1.0"),))] == 3
    assert found[(bucket, (("le", "+Inf"),))] == 4
    assert found[("vcuda_webhook_review_seconds_count", ())] == 4
    assert abs(found[("vcuda_webhook_review_seconds_sum", ())] - 2.0035) < 1e-9
    assert found[("vcuda_webhook_certificate_expiry_seconds", ())] == 3600.0


def test_a_latency_on_a_bucket_bound_counts_in_that_bucket() -> None:
    metrics = Metrics(lambda: 0.0)
    metrics.observe("allowed", 0.001)
    found = samples(metrics)
    assert found[("vcuda_webhook_review_seconds_bucket", (("le", "0.0005"),))] == 0
    assert found[("vcuda_webhook_review_seconds_bucket", (("le", "0.001"),))] == 1


def test_the_release_is_a_build_info_gauge_at_one() -> None:
    found = samples(Metrics(lambda: 0.0))
    assert found[("vcuda_build_info", (("version", VERSION),))] == 1
    assert [key for key in found if key[0] == "vcuda_build_info"] == \
        [("vcuda_build_info", (("version", VERSION),))]
