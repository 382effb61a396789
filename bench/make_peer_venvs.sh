#!/usr/bin/env bash
# Creates the peers' virtualenvs for bench/bench_cartpole.py, outside the project's dependencies,
# under $KUBERL_BENCH_VENVS (default bench/.venvs, gitignored; /work/bench-venvs on the bench machine):
#   sb3    torch==2.13.0 (CPU wheel), then stable-baselines3==2.9.2 + gymnasium
#   rllib  torch==2.13.0 (CPU wheel), then ray[rllib]==2.60.0 + gymnasium
# torch is installed first and pinned so the peer's own `torch` requirement is already met and pip
# never pulls a multi-GB CUDA build. Re-running is cheap: an existing venv is only topped up.
#   bash bench/make_peer_venvs.sh [sb3|rllib]...     (default: both)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH=torch==2.13.0
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(sb3 rllib)

make_venv() {  # name, peer requirements...
  local name=$1; shift
  local venv=${KUBERL_BENCH_VENVS:-bench/.venvs}/$name
  [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q "$TORCH"
  # The peer, with torch held at the version just installed.
  "$venv/bin/python" -m pip install -q "$@" "$TORCH"
  "$venv/bin/python" -c "import torch, gymnasium; print('$name: torch', torch.__version__, 'gymnasium', gymnasium.__version__)"
}

for t in "${targets[@]}"; do
  case $t in
    sb3) make_venv sb3 stable-baselines3==2.9.2 gymnasium ;;
    rllib) make_venv rllib "ray[rllib]==2.60.0" gymnasium ;;
    *) echo "unknown peer $t (sb3 | rllib)" >&2; exit 2 ;;
  esac
done
