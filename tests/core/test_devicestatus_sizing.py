"""``edged status`` shows autoscaling, memory and batch limits (the text, from a document)."""

from __future__ import annotations

from edgefleet.devicestatus import render_status

MI = 1 << 20


def test_sizing_lines() -> None:
    doc = {
        "device": {
            "name": "d",
            "memory": {
                "memoryAvailableFloor": 500 * MI,
                "memoryAvailable": 300 * MI,
                "underPressure": True,
            },
        },
        "workloads": [
            {
                "name": "m",
                "scaling": {
                    "minReplicas": 1,
                    "maxReplicas": 4,
                    "currentReplicas": 2,
                    "desiredReplicas": 3,
                    "lastDecision": {
                        "from": 2,
                        "to": 3,
                        "reason": "QueueDepthHigh",
                        "message": "60.0 requests in flight over 2 ready replica(s)",
                        "at": 1.0,
                    },
                },
                "batching": {"maxBatchSize": 8, "effectiveMaxBatchSize": 2, "rowBytes": 9},
            },
            {"name": "plain"},
        ],
    }
    text = render_status(doc)
    assert "memory available 300Mi, eviction floor 500Mi (under pressure)" in text
    assert (
        "  m: scaling 1..4, 2 ready, 3 desired; last 2 -> 3 QueueDepthHigh: "
        "60.0 requests in flight over 2 ready replica(s)"
    ) in text
    assert "  m: batches of at most 2 rows (maxBatchSize 8: memory is short)" in text
    assert "plain:" not in text
