#!/usr/bin/env bash
# Creates the peers' virtualenvs for bench/bench_cartpole.py, outside the project's dependencies,
# under $KUBERL_BENCH_VENVS (default bench/.venvs, gitignored):
#   sb3    stable-baselines3==2.9.2 + gymnasium, with MuJoCo (mujoco 3.3.7) for bench/bench_continuous.py's
#          MuJoCo task
#   rllib  ray[rllib]==2.60.0 + gymnasium, and PettingZoo with MPE (mpe2) for bench/bench_multiagent.py
# Both share the main venv's torch==2.13.0 (KUBERL_VENV, default .venv; made by scripts/setup-venv)
# instead of holding a copy each: with PyPI's CUDA build that is 5 GB a venv. The share is a folder
# of links to torch and what it needs in the main venv's site-packages (torch-VERSION-shared/),
# which a .pth file puts at the end of each peer's sys.path: pip sees torch 2.13.0 installed and
# keeps it, and a package the peer installs itself comes first. So all three run the same torch.
# Re-running is cheap: an existing venv is only topped up.
#   bash bench/make_peer_venvs.sh [sb3|rllib]...     (default: both)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
MAIN=${KUBERL_VENV:-.venv}
VENVS=${KUBERL_BENCH_VENVS:-bench/.venvs}
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(sb3 rllib)
[ -x "$MAIN/bin/python" ] || { echo "no main venv at $MAIN: run ./scripts/setup-venv first" >&2; exit 2; }
mkdir -p "$VENVS"
VENVS=$(cd "$VENVS" && pwd)

# The share: torch and every distribution it requires (recursively, markers evaluated), linked by
# their top-level files and folders from the main venv's site-packages.
SHARED=$("$MAIN/bin/python" - "$VENVS" <<'EOF'
import importlib.metadata as md, os, pathlib, re, sys
from packaging.requirements import Requirement

torch = md.distribution("torch")
share = pathlib.Path(sys.argv[1]) / f"torch-{torch.version.split('+')[0]}-shared"
todo, seen, done = [("torch", "")], {}, set()  # (distribution, extra it is required with)
while todo:
    name, extra = todo.pop()
    name = re.sub(r"[-_.]+", "-", name).lower()
    if (name, extra) in done:
        continue
    done.add((name, extra))
    try:
        dist = seen[name] = md.distribution(name)
    except md.PackageNotFoundError:
        continue
    for spec in dist.requires or []:
        req = Requirement(spec)
        if req.marker is None or req.marker.evaluate({"extra": extra}):
            todo += [(req.name, e) for e in ("", *req.extras)]  # cuda-toolkit[cublas,...] pulls nvidia-*
tmp = share.with_name(share.name + ".tmp")
if tmp.exists():
    for link in tmp.iterdir():
        link.unlink()
    tmp.rmdir()
tmp.mkdir()
for dist in seen.values():
    site = pathlib.Path(dist.locate_file(""))
    for top in {pathlib.Path(f).parts[0] for f in dist.files or []}:
        if top != ".." and not top.startswith("__pycache__") and not (tmp / top).exists():
            (tmp / top).symlink_to(site / top)
if share.exists():
    for link in share.iterdir():
        link.unlink()
    share.rmdir()
tmp.rename(share)
print(share)
EOF
)
TORCH=torch==$("$MAIN/bin/python" -c 'import importlib.metadata as m; print(m.version("torch").split("+")[0])')
echo "peers share $TORCH from $MAIN: $SHARED ($(ls "$SHARED" | wc -l) links)"

make_venv() {  # name, peer requirements...
  local name=$1; shift
  local venv=$VENVS/$name
  [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
  "$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' | {
    read -r site; echo "$SHARED" > "$site/kuberl-shared-torch.pth"; }
  "$venv/bin/python" -m pip install -q --upgrade pip
  # The peer, with torch held at the shared version (pip sees it installed and leaves it).
  "$venv/bin/python" -m pip install -q "$@" "$TORCH"
  "$venv/bin/python" -c "import torch, gymnasium; print('$name: torch', torch.__version__, 'from', torch.__file__, 'gymnasium', gymnasium.__version__)"
  du -sh "$venv" | sed "s|^|$name venv: |"
}

for t in "${targets[@]}"; do
  case $t in
    sb3) make_venv sb3 stable-baselines3==2.9.2 gymnasium "gymnasium[mujoco]" mujoco==3.3.7 ;;
    rllib) make_venv rllib "ray[rllib]==2.60.0" gymnasium pettingzoo==1.27.0 mpe2==1.1.1 ;;
    *) echo "unknown peer $t (sb3 | rllib)" >&2; exit 2 ;;
  esac
done
