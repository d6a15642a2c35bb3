"""What the metrics API clients of this folder share: a GET with the official Kubernetes Python
client as the HPA's client sends it, and the checks of the fields both APIs have."""
import kubernetes.client


def get(server, ca_file, token, path, query):
    """GETs `path` of `server` (trusting `ca_file`, as the bearer `token`) with the query
    parameters `query`, a list of (name, value); returns the decoded 200 body."""
    config = kubernetes.client.Configuration()
    config.host = server
    config.ssl_ca_cert = ca_file
    config.api_key = {"authorization": token}
    config.api_key_prefix = {"authorization": "Bearer"}
    api = kubernetes.client.ApiClient(config)
    request = api.param_serialize(
        "GET",
        path,
        query_params=query,
        # What the HPA's client sends: protobuf preferred, JSON accepted.
        header_params={"Accept": "application/vnd.kubernetes.protobuf, */*"},
        auth_settings=["BearerToken"],
    )
    response = api.call_api(*request)
    response.read()
    return api.response_deserialize(response, {"200": "object"}).data


def check_list(body, kind, api_version):
    """The list's kind, apiVersion and metadata."""
    assert body["kind"] == kind, body
    assert body["apiVersion"] == api_version, body
    assert isinstance(body["metadata"], dict), body


def check_timestamp(ts):
    # metav1.Time: RFC 3339, UTC, whole seconds.
    assert isinstance(ts, str) and len(ts) == 20 and ts.endswith("Z") and ts[10] == "T", ts
