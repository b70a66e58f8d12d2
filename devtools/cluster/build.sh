#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager and kube-scheduler from Debian bookworm's `kubernetes` source
# package, with Debian's Go 1.19, and unpacks Debian's etcd beside them. Nothing is installed system-wide:
# everything lives under $CONCH_K8S_CACHE (default ~/.cache/conch-k8s/<debian-version>). Idempotent: when the
# binaries are there it prints their folder and exits. First run: ~5 minutes on 2 cores, ~3 GB of disk while
# building (the build tree is removed afterwards), ~300 MB kept. See docs/test-cluster.md.
set -euo pipefail

DEB_VERSION="1.20.5+really1.20.2-1.1+deb12u1"
CACHE="${CONCH_K8S_CACHE:-$HOME/.cache/conch-k8s}/${DEB_VERSION}"
BIN="$CACHE/bin"
if [ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/kube-controller-manager" ] && [ -x "$BIN/kube-scheduler" ] \
    && [ -x "$BIN/etcd" ]; then
  echo "$BIN"; exit 0
fi
mkdir -p "$CACHE/dl" "$CACHE/apt/lists/partial" "$CACHE/apt/cache/archives/partial" "$CACHE/root" "$BIN"
log() { echo "[k8s-build] $*" >&2; }
# One build at a time (test processes starting together, CI's set-up beside a test run): the others wait for it,
# then find the binaries.
exec 9>"$CACHE/.build.lock"
flock 9
if [ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/kube-controller-manager" ] && [ -x "$BIN/kube-scheduler" ] \
    && [ -x "$BIN/etcd" ]; then
  echo "$BIN"; exit 0
fi

# A private apt state with deb-src entries beside the machine's own sources: nothing under /etc or /var changes.
SRC_DIR="$CACHE/apt/sources.list.d"; mkdir -p "$SRC_DIR"
: > "$CACHE/apt/sources.list"
for f in /etc/apt/sources.list.d/*.sources; do
  [ -e "$f" ] || continue
  cp "$f" "$SRC_DIR/$(basename "$f")"
  sed 's/^Types: deb$/Types: deb-src/' "$f" > "$SRC_DIR/src-$(basename "$f")"
done
if [ -s /etc/apt/sources.list ]; then
  grep -E '^deb ' /etc/apt/sources.list > "$CACHE/apt/sources.list" || true
  sed -n 's/^deb /deb-src /p' /etc/apt/sources.list >> "$CACHE/apt/sources.list"
fi
APT=(-o "Dir::Etc::SourceList=$CACHE/apt/sources.list" -o "Dir::Etc::SourceParts=$SRC_DIR"
     -o "Dir::State::Lists=$CACHE/apt/lists" -o "Dir::Cache=$CACHE/apt/cache" -o "Debug::NoLocking=1")

cd "$CACHE/dl"
if ! ls kubernetes_*.orig.tar.gz >/dev/null 2>&1 || ! ls golang-1.19-go_*.deb etcd-server_*.deb \
    golang-1.19-src_*.deb golang-github-modern-go-reflect2-dev_*.deb >/dev/null 2>&1; then
  log "apt-get update (private state)"
  apt-get "${APT[@]}" update -qq >&2
  log "downloading the kubernetes $DEB_VERSION source package, Go 1.19 and etcd"
  apt-get "${APT[@]}" source --download-only "kubernetes=$DEB_VERSION" >&2
  apt-get "${APT[@]}" download golang-1.19-go golang-1.19-src etcd-server golang-github-modern-go-reflect2-dev >&2
fi
for deb in golang-1.19-go_*.deb golang-1.19-src_*.deb etcd-server_*.deb golang-github-modern-go-reflect2-dev_*.deb; do
  dpkg -x "$deb" "$CACHE/root"
done
cp "$CACHE/root/usr/bin/etcd" "$BIN/etcd"

BUILD="$CACHE/build"
rm -rf "$BUILD"; mkdir -p "$BUILD"
log "unpacking the source"
tar -xzf "$CACHE"/dl/kubernetes_*.orig.tar.gz -C "$BUILD"
SRC="$(find "$BUILD" -mindepth 1 -maxdepth 1 -type d | head -1)"
# The vendored reflect2 1.0.1 crashes the apiserver on its first custom-resource request under Go >= 1.18.
R2="$CACHE/root/usr/share/gocode/src/github.com/modern-go/reflect2"
rm -rf "$SRC/vendor/github.com/modern-go/reflect2"
mkdir -p "$SRC/vendor/github.com/modern-go/reflect2"
find "$R2" -maxdepth 1 -type f -name '*.go' -exec cp {} "$SRC/vendor/github.com/modern-go/reflect2/" \;
[ -f "$R2/go.mod" ] && cp "$R2/go.mod" "$SRC/vendor/github.com/modern-go/reflect2/" || true

GOROOT="$(find "$CACHE/root/usr/lib" -maxdepth 1 -type d -name 'go-1.19' | head -1)"
SHIM="$CACHE/shim"; mkdir -p "$SHIM"
if ! command -v rsync >/dev/null; then
  # The Makefile only copies one file with rsync.
  printf '#!/bin/sh\nfor last; do :; done\nprev=""\nfor a; do [ "$a" = "$last" ] && break; prev="$a"; done\ncp -r "$prev" "$last"\n' > "$SHIM/rsync"
  chmod +x "$SHIM/rsync"
fi
log "building (about 5 minutes on 2 cores)"
( cd "$SRC" && env -u GOFLAGS PATH="$GOROOT/bin:$SHIM:$PATH" GOROOT="$GOROOT" GOPROXY=off GOFLAGS= \
    GO111MODULE= HOME="$CACHE/home" GOCACHE="$CACHE/gocache" GOPATH="$CACHE/gopath" \
    make WHAT="cmd/kube-apiserver cmd/kube-controller-manager cmd/kube-scheduler" >&2 )
for b in kube-apiserver kube-controller-manager kube-scheduler; do
  cp "$SRC/_output/local/bin/linux/amd64/$b" "$BIN/$b"
done
rm -rf "$BUILD" "$CACHE/gocache" "$CACHE/gopath" "$CACHE/home"
log "done"
echo "$BIN"
