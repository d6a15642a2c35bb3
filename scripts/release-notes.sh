#!/usr/bin/env bash
# Usage: scripts/release-notes.sh vX.Y.Z[-PRERELEASE]
#
# Checks that a release tag names the version the tree says everywhere, and prints the release
# notes: the body of CHANGELOG.md's `## [X.Y.Z] - YYYY-MM-DD` section (Keep a Changelog), without
# its heading. The release workflow (.github/workflows/release.yml) runs it first, so a tag the
# files disagree with publishes nothing. The version must be, all at once:
# - Cargo.toml's [workspace.package] version (every crate inherits it);
# - charts/percolator/Chart.yaml's `version` and `appVersion`;
# - the tag of every ghcr.io/une-tasse-de/percolator image named in deploy/ (and any kustomize
#   `newTag:` there);
# - the tag of the images in Chart.yaml's `artifacthub.io/images` annotation, when it has one;
# and CHANGELOG.md must have that version's section, dated, with something in it.
# Every disagreement is named (not only the first), on stderr, and the exit status is 1.
# Needs bash, coreutils, awk, sed and grep, nothing else.
set -euo pipefail
cd "$(dirname "$0")/.."

me="scripts/release-notes.sh"
image="ghcr.io/une-tasse-de/percolator"

if [ $# -ne 1 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
  echo "usage: $me vX.Y.Z[-PRERELEASE]   (a release tag: v, then the version)" >&2
  exit 2
fi
tag="$1"
# SemVer 2.0.0 without build metadata (a tag names one build); the leading v is git's convention
# and the workflow's tag filter.
semver='[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?'
if ! printf '%s\n' "$tag" | grep -Eqx "v$semver"; then
  if printf '%s\n' "$tag" | grep -Eqx "$semver"; then
    echo "$me: the tag $tag lacks its leading v: release tags are v$tag" >&2
  else
    echo "$me: $tag is not a release tag: vX.Y.Z or vX.Y.Z-PRERELEASE expected (e.g. v1.2.3, v1.2.3-rc.1)" >&2
  fi
  exit 1
fi
version="${tag#v}"

problems=()
disagree() {
  problems+=("$1")
}

# Cargo.toml: the `version` of [workspace.package].
cargo_version="$(awk '
  /^\[/ { in_package = ($0 == "[workspace.package]") }
  in_package && $1 == "version" { gsub(/^[^"]*"|".*$/, ""); print; exit }
' Cargo.toml)"
if [ -z "$cargo_version" ]; then
  disagree "Cargo.toml: no version in [workspace.package]"
elif [ "$cargo_version" != "$version" ]; then
  disagree "Cargo.toml: [workspace.package] version is $cargo_version, not $version"
fi

# Chart.yaml: top-level `version:` and `appVersion:` (quoted or not).
chart=charts/percolator/Chart.yaml
chart_field() {
  sed -n -E "s/^$1:[[:space:]]*[\"']?([^\"'[:space:]#]*)[\"']?[[:space:]]*(#.*)?\$/\\1/p" "$chart" | head -n 1
}
for field in version appVersion; do
  value="$(chart_field "$field")"
  if [ -z "$value" ]; then
    disagree "$chart: no top-level $field"
  elif [ "$value" != "$version" ]; then
    disagree "$chart: $field is $value, not $version"
  fi
done

# Chart.yaml's artifacthub.io/images annotation (a YAML list in a block scalar): each `image:`
# line of that block.
while IFS= read -r named; do
  [ -n "$named" ] || continue
  if [ "$named" != "$image:$version" ]; then
    disagree "$chart: artifacthub.io/images names $named, not $image:$version"
  fi
done < <(awk '
  /^[[:space:]]*artifacthub\.io\/images:/ { match($0, /^[[:space:]]*/); indent = RLENGTH; inside = 1; next }
  inside {
    if ($0 ~ /^[[:space:]]*$/) next
    match($0, /^[[:space:]]*/)
    if (RLENGTH <= indent) { inside = 0; next }
    if ($0 ~ /^[[:space:]]*(-[[:space:]]+)?image:/) {
      sub(/^[[:space:]]*(-[[:space:]]+)?image:[[:space:]]*/, ""); gsub(/["'\'']/, ""); sub(/[[:space:]]+(#.*)?$/, "")
      print
    }
  }
' "$chart")

# deploy/: every image reference to percolator's repository, and kustomize's newTag overrides
# (comments left out: they may show other versions).
found=0
while IFS= read -r line; do
  [ -n "$line" ] || continue
  file="${line%%:*}"
  content="${line#*:}"
  content="${content%%#*}"
  case "$content" in *"$image:"*) ;; *) continue ;; esac
  found=1
  named="$(printf '%s\n' "$content" | grep -oE "$image:[^[:space:]\"']+" | head -n 1)"
  if [ "$named" != "$image:$version" ]; then
    disagree "$file: names $named, not $image:$version"
  fi
done < <(grep -rHF --include='*.yaml' --include='*.yml' "$image:" deploy || true)
if [ "$found" = 0 ]; then
  disagree "deploy/: no image $image:<tag> found"
fi
while IFS= read -r line; do
  [ -n "$line" ] || continue
  file="${line%%:*}"
  new_tag="$(printf '%s\n' "${line#*:}" | sed -E "s/^[^:]*:[[:space:]]*[\"']?([^\"'[:space:]#]*).*/\\1/")"
  if [ "$new_tag" != "$version" ]; then
    disagree "$file: newTag is $new_tag, not $version"
  fi
done < <(grep -rHE --include='*.yaml' --include='*.yml' '^[[:space:]]*newTag:' deploy || true)

# CHANGELOG.md: the section `## [X.Y.Z] - YYYY-MM-DD`; its body ends at the next `## ` heading or
# at the link reference definitions Keep a Changelog puts at the end of the file; blank lines
# around it are left out (the command substitution drops the trailing ones).
changelog=CHANGELOG.md
escaped="$(printf '%s' "$version" | sed 's/[.]/\\./g')"
heading="$(grep -E "^## \[$escaped\]" "$changelog" || true)"
notes=""
if [ -z "$heading" ]; then
  disagree "$changelog: no section for $version (a heading \`## [$version] - YYYY-MM-DD\`)"
elif [ "$(printf '%s\n' "$heading" | wc -l)" -ne 1 ]; then
  disagree "$changelog: $(printf '%s\n' "$heading" | wc -l) sections for $version"
elif ! printf '%s\n' "$heading" | grep -Eqx "## \[$escaped\] - [0-9]{4}-[0-9]{2}-[0-9]{2}"; then
  disagree "$changelog: the heading \`$heading\` is not \`## [$version] - YYYY-MM-DD\`"
else
  notes="$(awk -v heading="$heading" '
    $0 == heading { inside = 1; next }
    inside && (/^## / || /^\[[^]]+\]:[[:space:]]/) { exit }
    inside { print }
  ' "$changelog" | sed -e '/./,$!d')"
  if [ -z "$notes" ]; then
    disagree "$changelog: the section for $version is empty"
  fi
fi

if [ ${#problems[@]} -gt 0 ]; then
  echo "$me: $tag disagrees with the tree:" >&2
  for problem in "${problems[@]}"; do
    echo "  - $problem" >&2
  done
  exit 1
fi
printf '%s\n' "$notes"
