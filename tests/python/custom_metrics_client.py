"""Reads a custom metric with the official Kubernetes Python client, as an independent
decoder of percolator's MetricValueList in custom.metrics.k8s.io v1beta2 or v1beta1.

usage: custom_metrics_client.py SERVER CA_FILE TOKEN VERSION PATH [LABEL_SELECTOR [METRIC_LABEL_SELECTOR]]
PATH is what follows /apis/custom.metrics.k8s.io/VERSION/ (e.g. namespaces/shop/pods/*/M);
an empty selector argument sends no selector.
Prints one JSON object: the items with their values parsed by kubernetes.utils.parse_quantity.
Exits non-zero when a field of the version is missing, malformed, or one of the other version.
"""
import json
import sys

from kubernetes.utils import parse_quantity

import metrics_api

GROUP = "custom.metrics.k8s.io"


def check_selector(selector):
    # A metav1.LabelSelector or null, never omitted.
    if selector is None:
        return
    assert isinstance(selector, dict), selector
    assert set(selector) <= {"matchLabels", "matchExpressions"}, selector
    for expression in selector.get("matchExpressions", []):
        assert set(expression) >= {"key", "operator"}, expression
        assert expression["operator"] in {"In", "NotIn", "Exists", "DoesNotExist"}, expression


def main():
    server, ca_file, token, version, path = sys.argv[1:6]
    selector = sys.argv[6] if len(sys.argv) > 6 else ""
    metric_selector = sys.argv[7] if len(sys.argv) > 7 else ""
    assert version in ("v1beta2", "v1beta1"), version
    metric = path.rstrip("/").split("/")[-1]
    query = []
    if selector:
        query.append(("labelSelector", selector))
    if metric_selector:
        query.append(("metricLabelSelector", metric_selector))
    body = metrics_api.get(server, ca_file, token, f"/apis/{GROUP}/{version}/{path}", query)
    metrics_api.check_list(body, "MetricValueList", f"{GROUP}/{version}")
    items = []
    for item in body["items"]:
        described = item["describedObject"]
        assert set(described) >= {"kind", "name", "apiVersion"}, item
        metrics_api.check_timestamp(item["timestamp"])
        if version == "v1beta2":
            assert set(item) == {"describedObject", "metric", "timestamp", "windowSeconds", "value"}, item
            assert set(item["metric"]) == {"name", "selector"}, item
            name, selector_seen = item["metric"]["name"], item["metric"]["selector"]
            window = item["windowSeconds"]
        else:
            assert set(item) == {"describedObject", "metricName", "timestamp", "window", "value", "selector"}, item
            name, selector_seen = item["metricName"], item["selector"]
            window = item["window"]
        assert name == metric, item
        assert isinstance(window, int) and not isinstance(window, bool), item
        check_selector(selector_seen)
        value = parse_quantity(item["value"])
        items.append(
            {
                "describedObject": described,
                "metric": name,
                "selector": selector_seen,
                "window": window,
                "raw": item["value"],
                "value": float(value),
            }
        )
    print(json.dumps({"items": items}))


if __name__ == "__main__":
    main()
