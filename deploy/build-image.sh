#!/usr/bin/env bash
# Builds the pyflannel image from deploy/Dockerfile with docker (when its daemon answers) or
# buildah. The build context is a temporary directory holding only what the Dockerfile copies,
# so nothing else from the source tree (virtualenvs, caches, keys) can reach the image.
#
#   deploy/build-image.sh [--tool docker|buildah] [--base IMAGE] [--tag IMAGE]
#                         [--source URL] [--source-dir DIR] [--ca-bundle FILE]
#
# Defaults: the tool found first, the Dockerfile's pinned base, tag pyflannel:v<version>,
# source from the git remote "origin". buildah honours its own environment as usual
# (BUILDAH_ISOLATION, CONTAINERS_STORAGE_CONF, ...). --ca-bundle names a CA bundle to trust
# while pip downloads (a TLS-inspecting proxy); it is passed as a build secret, never stored.
set -euo pipefail

usage() {
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

die() {
    echo "build-image.sh: $*" >&2
    exit 1
}

# An image reference: registry/name:tag or @digest, nothing a shell or the tool would read
# as anything else.
valid_image() {
    [[ "$1" =~ ^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}$ ]]
}

tool=""
base=""
tag=""
source_url=""
ca_bundle=""
source_dir="$(cd "$(dirname "$0")/.." && pwd)"
while [ "$#" -gt 0 ]; do
    case "$1" in
        --tool) [ "$#" -ge 2 ] || usage; tool="$2"; shift 2 ;;
        --base) [ "$#" -ge 2 ] || usage; base="$2"; shift 2 ;;
        --tag) [ "$#" -ge 2 ] || usage; tag="$2"; shift 2 ;;
        --source) [ "$#" -ge 2 ] || usage; source_url="$2"; shift 2 ;;
        --source-dir) [ "$#" -ge 2 ] || usage; source_dir="$2"; shift 2 ;;
        --ca-bundle) [ "$#" -ge 2 ] || usage; ca_bundle="$2"; shift 2 ;;
        -h|--help) usage ;;
        *) echo "build-image.sh: unknown argument: $1" >&2; usage ;;
    esac
done

[ -f "$source_dir/flannel/version.py" ] \
    || die "--source-dir $source_dir is not a pyflannel source tree (no flannel/version.py)"
version="$(sed -n 's/^__version__ = "\([0-9A-Za-z.+-]*\)"$/\1/p' "$source_dir/flannel/version.py")"
[ -n "$version" ] || die "cannot read __version__ from $source_dir/flannel/version.py"
tag="${tag:-pyflannel:v$version}"
valid_image "$tag" || die "--tag '$tag' is not an image reference"
if [ -n "$base" ]; then
    valid_image "$base" || die "--base '$base' is not an image reference"
fi

revision=unknown
if git -C "$source_dir" rev-parse --git-dir >/dev/null 2>&1; then
    revision="$(git -C "$source_dir" rev-parse HEAD)"
    [ -z "$(git -C "$source_dir" status --porcelain -- flannel pyproject.toml deploy)" ] \
        || revision="$revision-dirty"
    if [ -z "$source_url" ]; then
        source_url="$(git -C "$source_dir" remote get-url origin 2>/dev/null || true)"
        # Never publish credentials embedded in a remote (https://user:token@host/...).
        source_url="$(printf '%s' "$source_url" | sed -E 's#^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*@#\1#')"
        # A remote that is no URL-shaped value (odd characters) is labelled unknown, not fatal.
        [[ "$source_url" =~ ^[A-Za-z0-9/][A-Za-z0-9._/:@+~-]{0,254}$ ]] || source_url=unknown
    fi
fi
source_url="${source_url:-unknown}"
# A local path (a clone's origin) is as valid a source as a URL.
[[ "$source_url" =~ ^[A-Za-z0-9/][A-Za-z0-9._/:@+~-]{0,254}$ ]] \
    || die "--source '$source_url' is neither a URL nor an absolute path"

if [ -z "$tool" ]; then
    if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
        tool=docker
    elif command -v buildah >/dev/null 2>&1; then
        tool=buildah
    else
        die "neither a running docker nor buildah found: install one (Debian: apt-get install buildah)"
    fi
fi
case "$tool" in
    docker) build=(docker build) ;;
    buildah) build=(buildah build --layers) ;;
    *) die "--tool must be docker or buildah, not '$tool'" ;;
esac

context="$(mktemp -d)"
trap 'rm -rf "$context"' EXIT
mkdir -p "$context/deploy"
cp "$source_dir/pyproject.toml" "$source_dir/README.md" "$context/"
cp "$source_dir/deploy/Dockerfile" "$source_dir/deploy/requirements.lock" \
   "$source_dir/deploy/write-bytecode.py" "$source_dir/deploy/assemble-root.py" \
   "$context/deploy/"
cp -R "$source_dir/flannel" "$context/flannel"
find "$context/flannel" -name __pycache__ -type d -prune -exec rm -rf {} +

args=(--file "$context/deploy/Dockerfile" --tag "$tag"
      --build-arg "VERSION=$version" --build-arg "REVISION=$revision"
      --build-arg "SOURCE=$source_url")
if [ -n "$ca_bundle" ]; then
    [ -f "$ca_bundle" ] && [ -r "$ca_bundle" ] || die "--ca-bundle $ca_bundle is not a readable file"
    args+=(--secret "id=build-ca,src=$(realpath -- "$ca_bundle")")
fi
if [ -n "$base" ]; then
    args+=(--build-arg "BASE=$base")
fi
"${build[@]}" "${args[@]}" "$context"
echo "built $tag (version $version, revision $revision) with $tool"
