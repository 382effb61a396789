# Sourced by scripts/setup-venv, scripts/build-images and scripts/pin-deps: where torch comes from,
# and the wheel cache that the venv and the images install from (one download serves both).
#
# The cache lives outside the clone, so a fresh clone on the same machine reuses it:
#   KUBERL_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/kuberl)/wheels/
#     torch-2.13.0-<source>/   torch==2.13.0 from one source, and what it needs (for PyPI's CUDA
#                              build: the nvidia-* wheels, about 3 GB)
#     deps/                    everything else the images install (pip download, constraints.txt)
# A directory is complete once it holds `.complete`; a download cut short is redone, never used.
#
# Needs, set by the caller: ROOT (the repository), PY (a python with pip), DRY (1: print, run nothing)
# and a `run` function that prints a command and runs it unless DRY=1.

TORCH_VERSION=2.13.0   # also constraints.txt's pin; an upgrade changes both (scripts/pin-deps)
CPU_INDEX_DEFAULT=https://download.pytorch.org/whl/cpu
KUBERL_CACHE=${KUBERL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kuberl}
WHEELHOUSE=${KUBERL_WHEELHOUSE:-$KUBERL_CACHE/wheels}
# constraints.txt pins every package of the dev venv; KUBERL_CONSTRAINTS=none installs unpinned.
CONSTRAINTS=${KUBERL_CONSTRAINTS:-$ROOT/constraints.txt}
[ "$CONSTRAINTS" = none ] && CONSTRAINTS=""

index_reachable() {  # URL: does PyPI-style index URL answer for torch within 5 s?
  "$PY" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=5)' \
    "$1" >/dev/null 2>&1
}

# torch_source BUILD (cpu|cuda) [WHO]: decides where torch==TORCH_VERSION of that build comes from and
# says so. Sets TORCH_INDEX (empty: pip's configured index) and TORCH_WHEELS (its cache directory).
#   cpu:  KUBERL_TORCH_INDEX or PyTorch's CPU index; where it cannot be reached (5 s), pip's configured
#         index, whose torch may be either build (PyPI's, on Linux x86_64, is the CUDA one).
#   cuda: KUBERL_TORCH_INDEX (e.g. https://download.pytorch.org/whl/cu128), else pip's configured index.
torch_source() {
  local who=${2:-setup-venv} cpu_index=${KUBERL_TORCH_INDEX:-$CPU_INDEX_DEFAULT}
  TORCH_INDEX=""
  if [ "$1" = cpu ]; then
    if index_reachable "$cpu_index"; then
      TORCH_INDEX=$cpu_index
      echo "$who: torch from $cpu_index"
    else
      echo "$who: $cpu_index cannot be reached; torch from pip's configured index"
    fi
  elif [ -n "${KUBERL_TORCH_INDEX:-}" ]; then
    TORCH_INDEX=$KUBERL_TORCH_INDEX
    echo "$who: torch from $TORCH_INDEX"
  else
    echo "$who: torch from pip's configured index (PyPI's, on Linux x86_64, is the CUDA build)"
  fi
  local key=${TORCH_INDEX:-pip-index}
  key=${key#*://}
  TORCH_WHEELS=$WHEELHOUSE/torch-$TORCH_VERSION-$(printf %s "$key" | tr -c 'A-Za-z0-9._\n-' _ | sed 's/_*$//')
}

constrained() {  # the pip arguments that apply constraints.txt, if any
  [ -n "$CONSTRAINTS" ] && printf '%s\0' -c "$CONSTRAINTS"
  return 0
}

# fetch_torch: torch==TORCH_VERSION (from TORCH_INDEX alone, without its dependencies) and its
# dependencies (pip's configured index, pinned by constraints.txt) into TORCH_WHEELS, unless complete.
# torch's local version (+cpu, +cu128) sorts above the plain one, so the wheel fetched first wins
# over PyPI's of the same version. --no-cache-dir: the wheels are kept here, not twice.
# The cache stays locked until wheels_done (or the script's exit): another clone's set-up waits.
fetch_torch() {
  if [ "$DRY" = 0 ]; then   # one writer at a time in the cache (two clones may set up at once)
    mkdir -p "$WHEELHOUSE"
    exec 8>"$WHEELHOUSE/.lock"
    flock 8
  fi
  [ -f "$TORCH_WHEELS/.complete" ] && { echo "wheels: reusing $TORCH_WHEELS"; return 0; }
  local pip=("$PY" -m pip download -q --no-cache-dir --disable-pip-version-check -d "$TORCH_WHEELS")
  local pins=(); while IFS= read -r -d '' a; do pins+=("$a"); done < <(constrained)
  [ "$DRY" = 0 ] && { rm -rf "$TORCH_WHEELS"; mkdir -p "$TORCH_WHEELS"; }
  if [ -n "$TORCH_INDEX" ]; then
    run "${pip[@]}" --no-deps --index-url "$TORCH_INDEX" "torch==$TORCH_VERSION"
  fi
  run "${pip[@]}" --find-links "$TORCH_WHEELS" ${pins[@]+"${pins[@]}"} "torch==$TORCH_VERSION"
  [ "$DRY" = 1 ] || touch "$TORCH_WHEELS/.complete"
}

wheels_done() {  # release the lock fetch_torch took
  [ "$DRY" = 1 ] || exec 8>&-
}
