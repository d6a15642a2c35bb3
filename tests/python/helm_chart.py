"""Renders, lints and validates a Helm chart with Helm's own engine (helm-python-sdk, which
embeds Helm v4 as a library: no helm binary, no cluster), for tests/chart.rs.

usage: helm_chart.py render|lint|validate CHART_DIR < REQUEST_JSON

render    REQUEST is one case {"values", "name", "namespace", "api_versions"} or a list of
          cases; prints the rendered templates of each, {"manifests": {TEMPLATE_PATH: TEXT}}
          (NOTES.txt included), as one object or a list in the same order. "api_versions"
          (optional) is what `.Capabilities.APIVersions` holds beside Helm's defaults, as
          `helm template --api-versions` gives it: "GROUP/VERSION" or "GROUP/VERSION/KIND" (a
          cluster's discovery lists both), e.g. a cluster with cert-manager's CRDs. A template
          that fails (a `fail`, a `required`, a schema refusal) prints the error on stderr and
          exits 1.
lint      REQUEST is {"values", "namespace", "kube_version"}; prints Helm's report
          {"messages": [{"severity", "path", "error"}], "errors": [...]} (severity 1 info,
          2 warning, 3 error) after a strict lint (warnings count as errors in "errors").
validate  REQUEST is {"values"}; checks them against values.schema.json: prints {"valid": true},
          or the schema's message on stderr and exits 1.
command   REQUEST is {"command": "helm install NAME CHART ...", "api_versions"}, a `helm
          install`, `helm upgrade` or `helm template` command line as a document prints it
          (CHART relative to the repository, or the published
          oci://ghcr.io/une-tasse-de/charts/percolator with --version the repository's chart's,
          read as the repository's chart); parses
          it as helm does (-n/--namespace, --set, --set-string, --set-json, -f/--values,
          -a/--api-versions of helm template, and the flags that do not change what is
          rendered), checks the values against the schema and renders them: prints {"name",
          "namespace", "values", "api_versions", "manifests"}.
          "api_versions" (optional) is the cluster's (an install's or upgrade's), to which a
          template command's --api-versions add. A flag it does not know is an error, so a
          document cannot show one that helm would refuse.

The lookup function returns nothing (no cluster), as in `helm template`.
"""
import json
import os
import shlex
import sys

from helm_python import (
    Chart,
    HelmError,
    _native,
    lint,
    parse_set_json,
    parse_set_string,
    parse_set_string_values,
)


def render_chart(chart, values, name, namespace, api_versions=None):
    """Chart.render, with the API versions `.Capabilities.APIVersions` holds: the wrapper does
    not pass them, but the native helm_render takes them in its options (as `helm template
    --api-versions`)."""
    options = {"name": name, "namespace": namespace, "is_install": True}
    if api_versions:
        if not all(isinstance(v, str) and v.count("/") in (1, 2) for v in api_versions):
            raise ValueError(
                f"api_versions: GROUP/VERSION or GROUP/VERSION/KIND strings, not {api_versions}"
            )
        options["api_versions"] = list(api_versions)
    rendered = _native.call_string(
        "helm_render", chart._raw(), json.dumps(values), json.dumps(options)
    )
    return json.loads(rendered)


def render(chart_dir, request):
    chart = Chart.load(chart_dir)
    try:
        cases = request if isinstance(request, list) else [request]
        results = []
        for case in cases:
            manifests = render_chart(
                chart,
                case.get("values") or {},
                case.get("name", "percolator"),
                case.get("namespace", "percolator"),
                case.get("api_versions"),
            )
            results.append({"manifests": manifests})
        return results if isinstance(request, list) else results[0]
    finally:
        chart.close()


def lint_chart(chart_dir, request):
    return lint(
        chart_dir,
        request.get("values") or {},
        strict=True,
        namespace=request.get("namespace", "percolator"),
        kube_version=request.get("kube_version"),
    )


def validate(chart_dir, request):
    chart = Chart.load(chart_dir)
    try:
        chart.validate_schema(request.get("values") or {})
    finally:
        chart.close()
    return {"valid": True}


def merge(into, values):
    """Helm's coalescing of --set and -f values: maps merge key by key, the later value wins."""
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = value
    return into


# The chart as the release publishes it (an OCI artifact): the documents install it from there.
# Its templates are the repository's, so a command naming it must ask for the repository's
# version (`--version`, which an OCI reference needs to be reproducible): a document cannot
# show a version this tree does not publish.
PUBLISHED = "oci://ghcr.io/une-tasse-de/charts/percolator"

# Flags that take a value and do not change what is rendered, and those that take none.
IGNORED_WITH_VALUE = {"--timeout", "--kube-context", "--kubeconfig"}
IGNORED_ALONE = {
    "--create-namespace", "--reuse-values", "--reset-values", "--reset-then-reuse-values",
    "--take-ownership", "--install", "--wait", "--atomic", "--rollback-on-failure", "--dry-run",
    "--debug", "--devel",
}


def run_command(chart_dir, request):
    words = shlex.split(request["command"], comments=True)
    if words[:1] != ["helm"] or len(words) < 4 or words[1] not in ("install", "upgrade", "template"):
        raise ValueError(f"not a helm install, upgrade or template command: {request['command']}")
    positional, values, namespace, version = [], {}, "default", None
    api_versions = list(request.get("api_versions") or [])
    rest = words[2:]
    while rest:
        word = rest.pop(0)
        flag, _, attached = word.partition("=") if word.startswith("--") else (word, "", "")
        def value():
            if attached:
                return attached
            if not rest:
                raise ValueError(f"{flag} needs a value")
            return rest.pop(0)
        if flag in ("-n", "--namespace"):
            namespace = value()
        elif flag == "--set":
            merge(values, parse_set_string(value()))
        elif flag == "--set-string":
            merge(values, parse_set_string_values(value()))
        elif flag == "--set-json":
            merge(values, parse_set_json(value()))
        elif flag in ("-f", "--values"):
            import yaml  # PyYAML, a dependency of the kubernetes client the tests install

            with open(value()) as file:
                merge(values, yaml.safe_load(file) or {})
        elif flag == "--version":
            version = value()
        elif flag in ("-a", "--api-versions") and words[1] == "template":
            api_versions.extend(v for v in value().split(",") if v)
        elif flag in IGNORED_WITH_VALUE:
            value()
        elif flag in IGNORED_ALONE:
            pass
        elif word.startswith("-"):
            raise ValueError(f"unknown flag {word} in: {request['command']}")
        else:
            positional.append(word)
    if len(positional) != 2:
        raise ValueError(f"expected NAME CHART, got {positional}: {request['command']}")
    name, chart = positional
    if chart != PUBLISHED and os.path.realpath(chart) != os.path.realpath(chart_dir):
        raise ValueError(f"the command installs {chart}, not {chart_dir}")
    loaded = Chart.load(chart_dir)
    if chart == PUBLISHED and version != loaded.version:
        loaded.close()
        raise ValueError(
            f"{chart} --version {version}: this tree publishes version {loaded.version}"
            f": {request['command']}"
        )
    try:
        loaded.validate_schema(values)
        manifests = render_chart(loaded, values, name, namespace, api_versions)
    finally:
        loaded.close()
    return {
        "name": name,
        "namespace": namespace,
        "values": values,
        "api_versions": api_versions,
        "manifests": manifests,
    }


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("render", "lint", "validate", "command"):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    command, chart_dir = sys.argv[1], sys.argv[2]
    request = json.load(sys.stdin)
    try:
        if command == "render":
            result = render(chart_dir, request)
        elif command == "lint":
            result = lint_chart(chart_dir, request)
        elif command == "command":
            result = run_command(chart_dir, request)
        else:
            result = validate(chart_dir, request)
    except (HelmError, ValueError) as error:
        print(f"{type(error).__name__}: {error}", file=sys.stderr)
        sys.exit(1)
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
