#!/usr/bin/env bash
# Print the `pip install` arguments for torch (version ACCORD_TORCH_VERSION, set by scripts/setup.sh), on one line;
# scripts/setup.sh runs them.
#
# A bare `torch==2.13.0` from PyPI is the CUDA build on Linux (several GB of NVIDIA libraries), also on a machine
# without a GPU. So:
#   - ACCORD_TORCH_INDEX set: that index (e.g. https://download.pytorch.org/whl/cu128 for a CUDA 12.8 build;
#     empty: the plain name from pip's own index);
#   - an NVIDIA driver here (nvidia-smi, or /proc/driver/nvidia/version): the plain name, i.e. PyPI's CUDA build;
#   - otherwise the PyTorch CPU index (ACCORD_TORCH_CPU_INDEX, default https://download.pytorch.org/whl/cpu) when it
#     answers within 5 s, else the plain name: an offline machine whose pip index or mirror serves the CPU wheel
#     under the plain name keeps working, after at most 5 s of waiting.
set -euo pipefail
TORCH="torch==${ACCORD_TORCH_VERSION:-2.13.0}"
PY=${PYTHON:-python3}
if [ -n "${ACCORD_TORCH_INDEX+set}" ]; then
  index=$ACCORD_TORCH_INDEX
elif command -v nvidia-smi >/dev/null 2>&1 || [ -e /proc/driver/nvidia/version ]; then
  index=""
else
  cpu=${ACCORD_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
  probe=("$PY" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/torch/', timeout=4)" "$cpu")
  if command -v timeout >/dev/null 2>&1; then
    probe=(timeout 5 "${probe[@]}")  # name resolution is not bounded by the socket timeout
  fi
  if "${probe[@]}" >/dev/null 2>&1; then
    index=$cpu
  else
    index=""
  fi
fi
if [ -n "$index" ]; then
  echo "--index-url $index $TORCH"
else
  echo "$TORCH"
fi
