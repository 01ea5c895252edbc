#!/usr/bin/env bash
# The ghz configurations in deploy/ghz are valid: each config is JSON naming a method the
# worker serves, and the request data file, fed through `kdctl load` (which reads ghz's data
# format) to a real worker with the bundled model, gives only successful requests.
set -euo pipefail
rf=${TEST_SRCDIR:-$0.runfiles}/kdecode
kdecode=$rf/worker/kdecode kdctl=$rf/worker/kdctl
model=$rf/deploy/demo-model
tmp=${TEST_TMPDIR:-$(mktemp -d)}
for cfg in "$rf"/deploy/ghz/*.json; do
  [[ $(basename "$cfg") == generate-data.json ]] && continue
  call=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["call"])' "$cfg")
  case $call in
    kdecode.v1.Decoder.Generate|grpc.health.v1.Health.Check) ;;
    *) echo "FAIL: $cfg calls $call, which the worker does not serve"; exit 1 ;;
  esac
done
"$kdecode" serve --model "$model" --listen 127.0.0.1:0 --max-seqs 4 >"$tmp/serve.out" 2>"$tmp/serve.err" &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do [[ -s $tmp/serve.out ]] && break; sleep 0.1; done
port=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["port"])' "$tmp/serve.out")
for _ in $(seq 100); do "$kdctl" health --target "127.0.0.1:$port" --service kdecode.v1.Decoder >/dev/null 2>&1 && break; sleep 0.1; done
"$kdctl" load --target "127.0.0.1:$port" --data "$rf/deploy/ghz/generate-data.json" --concurrency 4 --requests 16 --json >"$tmp/load.json"
/usr/bin/python3 - "$tmp/load.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
ok, failed = r["requests"]["ok"], r["requests"]["failed"]
print(f"ghz data through kdctl load: ok {ok}, failed {failed}, errors {r['errors']}")
assert ok == 16 and failed == 0, r
PY
kill -TERM $pid
wait $pid
echo "ghz data test: ok"
