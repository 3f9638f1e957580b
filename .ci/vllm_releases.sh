#!/usr/bin/env bash
# The release tier (docs/vllm.md): vLLM's released Python and Triton ops (plan, convert, dcp)
# fuzzed through --impl OP=vllm, one release at a time, each under the revision it maps to.
#
#   bash .ci/vllm_releases.sh [VERSION...] [--device cuda] [--cases convert=300,dcp=300,plan=5000]
#
# Default: 0.27.0 .. 0.34.0 on the CPU. Wheels are downloaded once (pip download --no-deps) into
# ${MLAFUZZ_CACHE:-~/.cache/mlafuzz}/vllm/wheels; each release's op modules are extracted with our
# import shim into .../vllm/V/tree (never into the repository). On the CPU the tier runs under
# Triton 3.6.0 (the Triton those releases were tested with) in a venv of its own,
# .../vllm/venv-triton-3.6, that reuses this project's .venv for everything else: Triton 3.9's
# interpreter fails vLLM's kernels on prefill-workspace cases ("mask has unsupported dtype").
# TIER_TRITON=project keeps the project's Triton. Not part of .ci/run: it downloads ~2.5 GB once
# and runs for tens of minutes on a CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PROJECT_PY=${PROJECT_PY:-.venv/bin/python}
CACHE=${MLAFUZZ_CACHE:-$HOME/.cache/mlafuzz}
TIER_TRITON=${TIER_TRITON:-3.6.0}
device=cpu
for a in "$@"; do [[ $a == cuda || $a == --device=cuda ]] && device=cuda; done
PY=$PROJECT_PY
if [[ $device == cpu && $TIER_TRITON != project ]]; then
  venv="$CACHE/vllm/venv-triton-$TIER_TRITON"
  if ! "$venv/bin/python" -c "import triton, sys; sys.exit(triton.__version__ != '$TIER_TRITON')" 2>/dev/null; then
    echo "vllm_releases: making $venv (triton==$TIER_TRITON over this project's .venv)" >&2
    rm -rf "$venv"
    base=$("$PROJECT_PY" -c "import sys; print(sys.base_prefix)")/bin/python3
    "$base" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --no-deps "triton==$TIER_TRITON"
  fi
  # After the venv's own site-packages (its Triton wins), this checkout's, with its .pth files
  # (torch, the editable mlafuzz). Written on every run: the venv is shared by every checkout that
  # uses this cache, and a line left by another would import that checkout's mlafuzz.
  site=$("$PROJECT_PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  tier_site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  echo "import site; site.addsitedir('$site')" >"$tier_site/mlafuzz_project.pth"
  PY="$venv/bin/python"
fi
exec "$PY" .ci/vllm_releases.py --cache "$CACHE" --pip "$PROJECT_PY -m pip" "$@"
