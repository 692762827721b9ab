"""Prometheus text rendering of edgefleet.metrics, checked byte for byte (nothing faked)."""

from __future__ import annotations

import math

import pytest

from edgefleet.metrics import CONTENT_TYPE, Registry, format_value


def test_render_small_registry_exactly() -> None:
    registry = Registry()
    requests = registry.counter("edged_requests_total", "Requests served.", ("model", "code"))
    requests.labels(model="mnist", code=200).inc()
    requests.labels(model="mnist", code=200).inc(2)
    requests.labels(model="resnet", code=500).inc()
    registry.counter("edged_restarts_total", "Restarts.").inc()
    temperature = registry.gauge("edged_temperature_celsius", "SoC temperature.")
    temperature.set(41.5)
    depth = registry.gauge("edged_depth", "Depth.", ("controller",))
    depth.labels(controller="models").set_function(lambda: 3)
    latency = registry.histogram("edged_latency_seconds", "Latency.", ("model",), (0.5, 1))
    child = latency.labels(model="mnist")
    for value in (0.25, 0.5, 0.5, 4.0):
        child.observe(value)

    assert registry.render() == (
        "# HELP edged_requests_total Requests served.\n"
        "# TYPE edged_requests_total counter\n"
        'edged_requests_total{model="mnist",code="200"} 3.0\n'
        'edged_requests_total{model="resnet",code="500"} 1.0\n'
        "# HELP edged_restarts_total Restarts.\n"
        "# TYPE edged_restarts_total counter\n"
        "edged_restarts_total 1.0\n"
        "# HELP edged_temperature_celsius SoC temperature.\n"
        "# TYPE edged_temperature_celsius gauge\n"
        "edged_temperature_celsius 41.5\n"
        "# HELP edged_depth Depth.\n"
        "# TYPE edged_depth gauge\n"
        'edged_depth{controller="models"} 3.0\n'
        "# HELP edged_latency_seconds Latency.\n"
        "# TYPE edged_latency_seconds histogram\n"
        'edged_latency_seconds_bucket{model="mnist",le="0.5"} 3\n'
        'edged_latency_seconds_bucket{model="mnist",le="1.0"} 3\n'
        'edged_latency_seconds_bucket{model="mnist",le="+Inf"} 4\n'
        'edged_latency_seconds_sum{model="mnist"} 5.25\n'
        'edged_latency_seconds_count{model="mnist"} 4\n'
    )
    assert CONTENT_TYPE.startswith("text/plain; version=0.0.4")


def test_unlabelled_histogram_and_default_buckets() -> None:
    registry = Registry()
    registry.histogram("h", "H.").observe(0.003)
    lines = registry.render().splitlines()
    assert lines[2] == 'h_bucket{le="0.005"} 1'
    assert lines[-3] == 'h_bucket{le="+Inf"} 1'
    assert lines[-2:] == ["h_sum 0.003", "h_count 1"]


def test_escaping_of_help_and_label_values() -> None:
    registry = Registry()
    registry.counter("c", 'back\\slash "quoted"\nsecond line', ("path",)).labels(
        path='C:\\dir "x"\ny'
    ).inc()
    assert registry.render() == (
        '# HELP c back\\\\slash "quoted"\\nsecond line\n'
        "# TYPE c counter\n"
        'c{path="C:\\\\dir \\"x\\"\\ny"} 1.0\n'
    )


def test_labelled_family_without_children_renders_only_help_and_type() -> None:
    registry = Registry()
    registry.gauge("g", "G.", ("a",))
    assert registry.render() == "# HELP g G.\n# TYPE g gauge\n"
    assert Registry().render() == ""


def test_children_are_cached() -> None:
    counter = Registry().counter("c", "C.", ("a",))
    assert counter.labels(a="x") is counter.labels(a="x")
    assert counter.labels(a="x") is not counter.labels(a="y")


def test_gauge_operations_and_failing_callback_is_skipped() -> None:
    registry = Registry()
    gauge = registry.gauge("g", "G.", ("a",))
    gauge.labels(a="1").inc(5)
    gauge.labels(a="1").dec(2)

    def broken() -> float:
        raise RuntimeError("boom")

    gauge.labels(a="2").set_function(broken)
    assert registry.render().splitlines()[2:] == ['g{a="1"} 3.0']


@pytest.mark.parametrize(
    ("value", "text"),
    [(1, "1.0"), (0.25, "0.25"), (math.inf, "+Inf"), (-math.inf, "-Inf"), (math.nan, "NaN")],
)
def test_format_value(value: float, text: str) -> None:
    assert format_value(value) == text


def test_invalid_uses_raise_value_error() -> None:
    registry = Registry()
    counter = registry.counter("c_total", "C.", ("a",))
    with pytest.raises(ValueError, match="already registered"):
        registry.gauge("c_total", "again")
    with pytest.raises(ValueError, match="invalid metric name"):
        registry.counter("1abc", "x")
    with pytest.raises(ValueError, match="invalid metric name"):
        registry.counter("a-b", "x")
    with pytest.raises(ValueError, match="invalid label name"):
        registry.counter("x", "x", ("bad-label",))
    with pytest.raises(ValueError, match="invalid label name"):
        registry.counter("y", "x", ("__reserved",))
    with pytest.raises(ValueError, match="duplicate label"):
        registry.counter("z", "x", ("a", "a"))
    with pytest.raises(ValueError, match="reserved"):
        registry.histogram("h", "x", ("le",))
    with pytest.raises(ValueError, match="strictly increasing"):
        registry.histogram("h2", "x", buckets=(1, 0.5))
    with pytest.raises(ValueError, match="needs exactly"):
        counter.labels(b="1")
    with pytest.raises(ValueError, match="needs exactly"):
        counter.labels(a="1", b="2")
    with pytest.raises(ValueError, match=r"use \.labels"):
        counter.inc()
    with pytest.raises(ValueError, match="only goes up"):
        counter.labels(a="1").inc(-1)
    with pytest.raises(TypeError):
        registry.counter("s", "x", "abc")
    assert registry.get("c_total") is counter
    assert registry.get("h") is None
