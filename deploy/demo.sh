#!/usr/bin/env bash
# The main job on the embedded default: the decode worker on the CPU backend with the
# bundled demo model, listening on 127.0.0.1:50051 (metrics on 127.0.0.1:9464).
# Extra arguments go to `kdecode serve` (e.g. --listen 0.0.0.0:50051 --max-seqs 16).
# Ctrl-C drains and stops it.
set -euo pipefail
here=${RUNFILES_DIR:-$0.runfiles}/kdecode
[[ -d $here ]] || here=.
model=$here/deploy/demo-model
cat >&2 <<TXT
kdecode: starting the decode worker (CPU backend, bundled model: preset demo, seed 1).
Call it from another terminal, for example:
  bazel run //worker:kdctl -- generate --target 127.0.0.1:50051 --prompt-ids 1,17,42,99 --max-tokens 16
  bazel run //worker:kdctl -- health --target 127.0.0.1:50051
  bazel run //worker:kdctl -- load --target 127.0.0.1:50051 --concurrency 4 --duration 10
  curl -s 127.0.0.1:9464/metrics | grep kdecode_
  grpcurl -plaintext -d '{"prompt_token_ids":[1,2,3],"max_tokens":8}' 127.0.0.1:50051 kdecode.v1.Decoder/Generate
TXT
exec "$here/worker/kdecode" serve --model "$model" --listen 127.0.0.1:50051 --metrics-listen 127.0.0.1:9464 "$@"
