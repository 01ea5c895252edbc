#!/usr/bin/env bash
# CPU prefill/decode throughput of the bundled demo model and the oracle `small` model.
# Run with `bazel run //tests/bench:cpu`; results go to tests/bench/results/cpu.{json,md}.
set -euo pipefail
rf=${RUNFILES_DIR:-$0.runfiles}
top=${BUILD_WORKSPACE_DIRECTORY:?run through bazel run}
small=$rf/oracle/small/model
[[ -d $small ]] || small=$rf/kdecode/external/oracle/small/model
commit=$(git -C "$top" rev-parse --short HEAD 2>/dev/null || echo unknown)
mkdir -p "$top/tests/bench/results"
"$rf/kdecode/tests/bench/cpu_bench" "$top/tests/bench/results/cpu" "$commit" \
  "bazel run //tests/bench:cpu" demo="$rf/kdecode/deploy/demo-model" small="$small"
cat "$top/tests/bench/results/cpu.md"
