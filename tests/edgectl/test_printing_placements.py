"""A deployment's selector and its placements as edgectl prints them (pure: documents in,
text out)."""

from __future__ import annotations

from edgectl.printing import describe_deployment, selector_text


def test_the_selector_reads_as_a_label_selector() -> None:
    assert selector_text({}) == "<none>"
    assert selector_text({"nodeSelector": {"site": "a"}}) == "site=a"
    expressions = [
        {"key": "tier", "operator": "In", "values": ["a", "b"]},
        {"key": "zone", "operator": "NotIn", "values": ["x"]},
        {"key": "npu", "operator": "Exists"},
        {"key": "lab", "operator": "DoesNotExist"},
    ]
    assert selector_text({"nodeSelector": {"site": "a"}, "matchExpressions": expressions}) == (
        "site=a,tier in (a,b),zone notin (x),npu,!lab"
    )


def test_describe_says_when_there_are_more_placements_and_none() -> None:
    doc = {"metadata": {"name": "det"}, "spec": {"model": {"name": "det", "version": "1"}}}
    assert "\nPlacements:       <none>\n" in describe_deployment(doc, [], now=0.0)
    one = {
        "spec": {"deployment": "det", "device": "cam"},
        "status": {"revision": 3, "version": "1", "replicas": 2, "readyReplicas": 1,
                   "phase": "Loading", "reason": ""},
    }  # fmt: skip
    text = describe_deployment(doc, [], now=0.0, placed=[one], more_placed=True)
    assert "\n  cam      3 (1)      1/2     Loading\n" in text, text
    assert "and more: edgectl get placements --for deployment/det" in text
