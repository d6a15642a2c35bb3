"""Reads an external metric with the official Kubernetes Python client, as an independent
decoder of percolator's ExternalMetricValueList.

usage: external_metrics_client.py SERVER CA_FILE TOKEN NAMESPACE METRIC [LABEL_SELECTOR]
Prints one JSON object: the items with their values parsed by kubernetes.utils.parse_quantity.
Exits non-zero when a field is missing or malformed.
"""
import json
import sys

import kubernetes.client
from kubernetes.utils import parse_quantity


def main():
    server, ca_file, token, namespace, metric = sys.argv[1:6]
    selector = sys.argv[6] if len(sys.argv) > 6 else None
    config = kubernetes.client.Configuration()
    config.host = server
    config.ssl_ca_cert = ca_file
    config.api_key = {"authorization": token}
    config.api_key_prefix = {"authorization": "Bearer"}
    api = kubernetes.client.ApiClient(config)
    query = [("labelSelector", selector)] if selector else []
    request = api.param_serialize(
        "GET",
        f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{namespace}/{metric}",
        query_params=query,
        header_params={"Accept": "application/vnd.kubernetes.protobuf, */*"},
        auth_settings=["BearerToken"],
    )
    response = api.call_api(*request)
    response.read()
    body = api.response_deserialize(response, {"200": "object"}).data
    assert body["kind"] == "ExternalMetricValueList", body
    assert body["apiVersion"] == "external.metrics.k8s.io/v1beta1", body
    assert isinstance(body["metadata"], dict), body
    items = []
    for item in body["items"]:
        assert set(item) >= {"metricName", "metricLabels", "timestamp", "window", "value"}, item
        assert item["metricName"] == metric, item
        assert isinstance(item["metricLabels"], dict), item
        assert isinstance(item["window"], int), item
        # metav1.Time: RFC 3339, UTC, whole seconds.
        ts = item["timestamp"]
        assert len(ts) == 20 and ts.endswith("Z") and ts[10] == "T", ts
        value = parse_quantity(item["value"])
        items.append({"labels": item["metricLabels"], "value": float(value), "raw": item["value"], "window": item["window"]})
    print(json.dumps({"items": items}))


if __name__ == "__main__":
    main()
