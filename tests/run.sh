#!/usr/bin/env bash
# The test command (README, .ci/run): installs what is missing, builds everything, runs every
# test, then runs every test again under AddressSanitizer + UndefinedBehaviorSanitizer.
# Needs ../shared/oracle beside the checkout (the reference vectors).
set -euo pipefail
cd "$(dirname "$0")/.."

deploy/setup.sh
if [[ ! -d ../shared/oracle ]]; then
  echo "tests: ../shared/oracle (reference vectors) not found beside the checkout" >&2
  exit 1
fi

jobs=()
[[ -n ${CI:-} ]] && jobs=(--show_progress_rate_limit=30)

bazel build "${jobs[@]}" //...
bazel test "${jobs[@]}" //...
bazel test "${jobs[@]}" --config=san //...
echo "tests: all passed (plain and under ASan/UBSan)"
