"""Packages a Helm chart as `helm package` does, with Helm's own engine (helm-python-sdk, Helm v4
as a library: no helm binary), for tests/release.rs.

usage: helm_package.py CHART_DIR DESTINATION_DIR

Prints {"path": the archive written, "files": [its members], "chart": its Chart.yaml, parsed}.
A chart Helm refuses to package prints Helm's error on stderr and exits 1.
"""
import json
import sys
import tarfile

import yaml
from helm_python import HelmError, package


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    chart_dir, destination = sys.argv[1:]
    try:
        path = package(chart_dir, destination=destination)
    except HelmError as error:
        sys.exit(f"helm package {chart_dir}: {error}")
    with tarfile.open(path, "r:gz") as archive:
        files = sorted(member.name for member in archive.getmembers() if member.isfile())
        charts = [name for name in files if name.count("/") == 1 and name.endswith("/Chart.yaml")]
        if len(charts) != 1:
            sys.exit(f"{path}: one top-level Chart.yaml expected, found {charts}")
        chart = yaml.safe_load(archive.extractfile(charts[0]).read())
    json.dump({"path": path, "files": files, "chart": chart}, sys.stdout)


if __name__ == "__main__":
    main()
