#!/usr/bin/env bash
# The prefill -> decode state handoff on loopback against the raw TCP floor (see bench.py).
# Run with `bazel run //tests/bench/handoff:bench`; results: tests/bench/results/handoff_cpu.{json,md}.
# Extra arguments go to bench.py (--requests N, --warmup N, --prompt-len N).
set -euo pipefail
rf=${RUNFILES_DIR:-$0.runfiles}
top=${BUILD_WORKSPACE_DIRECTORY:?run through bazel run}
commit=$(git -C "$top" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git -C "$top" status --porcelain 2>/dev/null | head -1)" ]; then commit="$commit (with uncommitted changes)"; fi
mkdir -p "$top/tests/bench/results"
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY grpc_proxy all_proxy ALL_PROXY
export no_proxy='*'
exec /usr/bin/python3 -u "$rf/kdecode/tests/bench/handoff/bench.py" \
  --kdecode "$rf/kdecode/worker/kdecode" --floor "$rf/kdecode/tests/bench/handoff/tcp_floor" \
  --proto "$rf/kdecode/proto/kdecode/v1/decoder.proto" \
  --out "$top/tests/bench/results/handoff_cpu" --commit "$commit" \
  --command "bazel run //tests/bench/handoff:bench" "$@"
