# Sourced by scripts/build-control-plane, build-kueue, build-kuberay and build-kwok: the cache the Go builds
# share, the environment they build in, and the steps of a build of one Go module's binary at a pinned
# release (build-kueue, build-kuberay, build-kwok). Each script pins its own versions at its top; the
# Python side reads them from there (tests/bed/common.py, `pinned`).
#
# The cache lives outside the clone, so a fresh clone on the same machine (CI) reuses it:
#   KUBERL_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/kuberl)/
#     go/mod, go/build       GOMODCACHE and GOCACHE, shared by every build and every version
#     <name>-<version>/bin/  one module's binary, and manifests from the same module beside it; done once it
#                            holds .complete (written last: a build cut short is redone, never used)
#
# Go: the installed `go` (GOTOOLCHAIN=local, so a release whose go.mod wants a newer Go fails saying so);
# KUBERL_GOTOOLCHAIN=go1.27.3 lets go fetch that toolchain through the module proxy instead.

KUBERL_CACHE=${KUBERL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kuberl}
WHO=$(basename "$0")

usage() {  # the calling script's opening comment
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
}

# go_env [GOBIN]: the environment of every Go build here, on the one shared module cache.
go_env() {
  command -v go >/dev/null 2>&1 || { echo "$WHO: no 'go' on PATH: install Go (1.26 or newer)" >&2; exit 1; }
  export GOMODCACHE=$KUBERL_CACHE/go/mod GOCACHE=$KUBERL_CACHE/go/build
  # -modcacherw: Go makes its module cache read-only; this keeps `rm -rf ~/.cache/kuberl` working. The
  # caller's GOFLAGS (-mod=vendor, ...) and a go.work would change the build, so they are replaced.
  export GOFLAGS=-modcacherw GOWORK=off CGO_ENABLED=0
  export GOTOOLCHAIN=${KUBERL_GOTOOLCHAIN:-local}
  if [ -n "${1:-}" ]; then export GOBIN=$1; fi
}

# go_module_start NAME VERSION BINARY [ARG]: the start of a build of BINARY at VERSION into
# BIN=$KUBERL_CACHE/NAME-VERSION/bin. Built already: prints the binary and exits. ARG --print-bin: prints
# it, or fails (exit 1) when it is not built; -h/--help: the script's opening comment. Otherwise sets up
# Go (go_env, GOBIN=BIN) and returns: the script builds (go_install), copies its manifests
# (go_module_dir, yaml_documents) and ends with go_module_done.
go_module_start() {
  VERSION=$2 BINARY=$3 BIN=$KUBERL_CACHE/$1-$2/bin
  case "${4:-}" in
    -h|--help) usage; exit 0 ;;
    ""|--print-bin) ;;
    *) echo "$WHO: unknown argument '$4' (see --help)" >&2; exit 2 ;;
  esac
  if [ -x "$BIN/$BINARY" ] && [ -f "$BIN/.complete" ]; then
    echo "$BIN/$BINARY"
    exit 0
  fi
  if [ "${4:-}" = --print-bin ]; then
    echo "$WHO: not built: $BIN is missing or incomplete (run ./scripts/$WHO)" >&2
    exit 1
  fi
  go_env "$BIN"
  mkdir -p "$BIN"
}

# go_install PACKAGE [LDFLAGS]: `go install PACKAGE@VERSION` into BIN, stripped and without local paths;
# says on stderr how long it took and how big the binary is.
go_install() {
  local started
  started=$(date +%s)
  go install -trimpath -ldflags "-s -w${2:+ $2}" "$1@$VERSION"
  echo "$WHO: built $BINARY $VERSION in $(( $(date +%s) - started )) s ($(du -h "$BIN/$BINARY" | cut -f1))" >&2
}

go_module_dir() {  # MODULE: its source at VERSION, in the module cache
  go list -m -f '{{.Dir}}' "$1@$VERSION" 2>/dev/null || echo "$GOMODCACHE/$1@$VERSION"
}

yaml_documents() {  # FILE...: one multi-document YAML stream of them all, on stdout
  local f
  for f in "$@"; do echo "---"; cat "$f"; done
}

go_module_done() {  # what was copied from the module cache writable, the build marked complete; the binary
  chmod -R u+w "$BIN"
  touch "$BIN/.complete"
  echo "$BIN/$BINARY"
}
