#!/usr/bin/env bash
# Set up .venv with the test extras and run the whole test suite, one pytest-xdist worker per core (at most 4;
# tests/conftest.py groups the tests that must share a worker). Extra arguments go to pytest after these, so
# `-m "not slow"`, a test file or `-n 0` (one process) work as usual.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ACCORD_EXTRAS=test,smollm2 bash scripts/setup.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
python -m pytest -q -p no:cacheprovider -n auto --maxprocesses 4 --dist loadgroup "$@"
