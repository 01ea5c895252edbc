#!/usr/bin/env bash
# The n-gram proposer on the host: the scan of the history against the index (worker/spec.h).
# Run with `bazel run //tests/bench:ngram`; results go to tests/bench/results/ngram_cpu.{json,md}.
set -euo pipefail
rf=${RUNFILES_DIR:-$0.runfiles}
top=${BUILD_WORKSPACE_DIRECTORY:?run through bazel run}
commit=$(git -C "$top" rev-parse --short HEAD 2>/dev/null || echo unknown)
mkdir -p "$top/tests/bench/results"
"$rf/kdecode/tests/bench/ngram_bench" "$top/tests/bench/results/ngram_cpu" "$commit" "bazel run //tests/bench:ngram"
cat "$top/tests/bench/results/ngram_cpu.md"
