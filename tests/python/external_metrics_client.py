"""Reads an external metric with the official Kubernetes Python client, as an independent
decoder of percolator's ExternalMetricValueList.

usage: external_metrics_client.py SERVER CA_FILE TOKEN NAMESPACE METRIC [LABEL_SELECTOR]
Prints one JSON object: the items with their values parsed by kubernetes.utils.parse_quantity.
Exits non-zero when a field is missing or malformed.
"""
import json
import sys

from kubernetes.utils import parse_quantity

import metrics_api


def main():
    server, ca_file, token, namespace, metric = sys.argv[1:6]
    selector = sys.argv[6] if len(sys.argv) > 6 else None
    query = [("labelSelector", selector)] if selector else []
    path = f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{namespace}/{metric}"
    body = metrics_api.get(server, ca_file, token, path, query)
    metrics_api.check_list(body, "ExternalMetricValueList", "external.metrics.k8s.io/v1beta1")
    items = []
    for item in body["items"]:
        assert set(item) >= {"metricName", "metricLabels", "timestamp", "window", "value"}, item
        assert item["metricName"] == metric, item
        assert isinstance(item["metricLabels"], dict), item
        assert isinstance(item["window"], int), item
        metrics_api.check_timestamp(item["timestamp"])
        value = parse_quantity(item["value"])
        items.append({"labels": item["metricLabels"], "value": float(value), "raw": item["value"], "window": item["window"]})
    print(json.dumps({"items": items}))


if __name__ == "__main__":
    main()
