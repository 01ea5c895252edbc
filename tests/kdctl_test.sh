#!/bin/bash
# kdctl_test.sh: kdctl end to end against tests/fake_server.py (a fake Decoder + Health
# server in Python grpc): generate (tokens, --json shape, flags on the wire, error mapping,
# retry pushback, abort of a live request), loads, info, health, abort, the load generator
# (closed and open loop, a ghz-style data file with templates and failing entries), TLS,
# mutual TLS and strict flag parsing. Outside Bazel set KDCTL_BIN (and run from the checkout).
set -u

PY=/usr/bin/python3
OPENSSL=/usr/bin/openssl

find_runfile() {
    local c
    for c in "${TEST_SRCDIR:-}/kdecode/$1" "${RUNFILES_DIR:-}/kdecode/$1"; do
        if [ -e "$c" ]; then echo "$c"; return 0; fi
    done
    return 1
}
HERE=$(cd "$(dirname "$0")" && pwd)
KDCTL=${KDCTL_BIN:-$(find_runfile worker/kdctl)} ||
    { echo "FAIL: kdctl not in runfiles (outside Bazel set KDCTL_BIN)"; exit 1; }
FAKE=$(find_runfile tests/fake_server.py) || FAKE=$HERE/fake_server.py
DECODER_PROTO=$(find_runfile proto/kdecode/v1/decoder.proto) || DECODER_PROTO=$HERE/../proto/kdecode/v1/decoder.proto
PROTO_DIR=$(dirname "$(dirname "$(dirname "$DECODER_PROTO")")")
[ -x "$KDCTL" ] || { echo "FAIL: $KDCTL is not executable"; exit 1; }
[ -f "$FAKE" ] || { echo "FAIL: fake_server.py not found"; exit 1; }
[ -f "$PROTO_DIR/grpc/health/v1/health.proto" ] || { echo "FAIL: protos not found under $PROTO_DIR"; exit 1; }

TMP=$(mktemp -d "${TEST_TMPDIR:-/tmp}/kdctl_test.XXXXXX")
FAILS=0
CHECKS=0
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
ok() { CHECKS=$((CHECKS + 1)); }

PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
}
trap cleanup EXIT

# start_fake NAME [fake_server flags...]: starts a fake server, sets PORT_<NAME>; its
# requests are logged to $TMP/NAME.log.
start_fake() {
    local name=$1
    shift
    "$PY" "$FAKE" --proto-dir "$PROTO_DIR" --log "$TMP/$name.log" "$@" >"$TMP/$name.port" 2>"$TMP/$name.err" &
    PIDS+=($!)
    local i
    for i in $(seq 1 200); do
        if [ -s "$TMP/$name.port" ]; then
            printf -v "PORT_$name" '%s' "$(head -n1 "$TMP/$name.port")"
            return 0
        fi
        if ! kill -0 "${PIDS[-1]}" 2>/dev/null; then break; fi
        sleep 0.1
    done
    echo "FAIL: fake server $name did not start:"
    cat "$TMP/$name.err"
    exit 1
}

# run NAME kdctl-args...: runs kdctl; stdout, stderr and the exit code land in OUT, ERR, RC.
run() {
    local name=$1
    shift
    "$KDCTL" "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"
    RC=$?
    OUT=$(cat "$TMP/$name.out")
    ERR=$(cat "$TMP/$name.err")
}

# expect_rc WANT WHAT: checks RC.
expect_rc() {
    if [ "$RC" -eq "$1" ]; then ok; else fail "$2: exit $RC, want $1 (stdout: $OUT) (stderr: $ERR)"; fi
}

# jcheck WHAT PYTHON-EXPR: the last kdctl stdout is one JSON line and EXPR (over d) holds.
jcheck() {
    local lines
    lines=$(printf '%s\n' "$OUT" | grep -c .)
    if [ "$lines" -ne 1 ]; then fail "$1: want exactly one JSON line, got $lines: $OUT"; return; fi
    if "$PY" -c 'import json, sys
d = json.loads(sys.argv[1])
sys.exit(0 if eval(sys.argv[2]) else 1)' "$OUT" "$2" 2>"$TMP/jcheck.err"; then
        ok
    else
        fail "$1: $2 does not hold for $OUT $(cat "$TMP/jcheck.err")"
    fi
}

# expect_in WHAT NEEDLE HAYSTACK
expect_in() {
    case "$3" in *"$2"*) ok ;; *) fail "$1: \"$2\" not in: $3" ;; esac
}

# The fake's tokens: (sum(prompt) + i) % 1000 for i < n.
fake_tokens() {
    "$PY" -c 'import sys; s = sum(int(x) for x in sys.argv[1].split(",")); n = int(sys.argv[2])
print([(s + i) % 1000 for i in range(n)])' "$1" "$2"
}

start_fake plain
T="127.0.0.1:$PORT_plain"

# ---- generate ----
run gen_human generate --target "$T" --prompt-ids 1,2,3 --max-tokens 10
expect_rc 0 "generate (human)"
expect_in "generate (human) tokens" "6 7 8 9 10 11 12 13 14 15" "$(head -n1 "$TMP/gen_human.out")"
expect_in "generate (human) finish" "finish: length" "$OUT"
expect_in "generate (human) usage" "completion 10" "$OUT"

run gen_json generate --target "$T" --prompt-ids 990,5 --max-tokens 10 --json
expect_rc 0 "generate --json"
jcheck "generate --json tokens" "d['tokens'] == $(fake_tokens 990,5 10)"
jcheck "generate --json shape" "list(d) == ['tokens', 'finish', 'request_id', 'usage'] and d['finish'] == 'length' and d['request_id'] != ''"
jcheck "generate --json usage" "all(k in d['usage'] for k in ['prompt_tokens', 'completion_tokens', 'cached_tokens', 'drafted_tokens', 'accepted_tokens', 'steps', 'time_to_first_token_seconds', 'total_seconds']) and d['usage']['prompt_tokens'] == 2 and d['usage']['completion_tokens'] == 10 and d['usage']['steps'] >= 4"

run gen_stop generate --target "$T" --prompt-ids 4,2 --max-tokens 50 --stop-ids 9,500 --json
expect_rc 0 "generate --stop-ids"
jcheck "generate --stop-ids" "d['tokens'] == [6, 7, 8, 9] and d['finish'] == 'stop'"

run gen_flags generate --target "$T" --prompt-ids 7 --max-tokens 3 --temperature 0.5 --top-k 40 --top-p 0.9 \
    --seed 18446744073709551615 --spec-tokens 3 --draft-ids 4,5 --stop-ids 7,8 --ignore-eos --request-id req-flags \
    --ngram-min 2 --ngram-max 4 --timeout 30 --json
expect_rc 0 "generate with every flag"
jcheck "generate with every flag: request id" "d['request_id'] == 'req-flags'"
OUT=$(grep '"req-flags"' "$TMP/plain.log" | tail -n1)
jcheck "generate flags on the wire" "d['request']['sampling'] == {'temperature': 0.5, 'top_k': 40, 'top_p': 0.9, 'seed': '18446744073709551615'} and d['request']['speculation'] == {'num_draft_tokens': 3, 'source': 'DRAFT_SOURCE_CALLER', 'ngram_min': 2, 'ngram_max': 4, 'draft_token_ids': [4, 5]} and d['request']['stop_token_ids'] == [7, 8] and d['request']['ignore_eos'] is True and d['request']['max_tokens'] == 3"

run gen_draft generate --target "$T" --prompt-ids 7 --max-tokens 2 --draft none --request-id req-draft
expect_rc 0 "generate --draft none"
OUT=$(grep '"req-draft"' "$TMP/plain.log" | tail -n1)
jcheck "generate --draft none on the wire" "d['request']['speculation'] == {'source': 'DRAFT_SOURCE_NONE'} and 'sampling' not in d['request']"

# Error mapping: INVALID_ARGUMENT (empty prompt), RESOURCE_EXHAUSTED with the pushback.
run gen_empty generate --target "$T" --prompt-ids "" --max-tokens 5 --json
expect_rc 1 "generate, empty prompt"
jcheck "generate, empty prompt: error JSON" "d == {'error': {'code': 3, 'name': 'INVALID_ARGUMENT', 'message': 'prompt_token_ids: at least one token'}}"
expect_in "generate, empty prompt: stderr" "INVALID_ARGUMENT" "$ERR"

run gen_busy generate --target "$T" --prompt-ids 1 --max-tokens 5 --request-id busy --json
expect_rc 1 "generate, busy"
jcheck "generate, busy: error JSON" "d['error']['code'] == 8 and d['error']['name'] == 'RESOURCE_EXHAUSTED' and d['error']['retry_pushback_ms'] == 250 and d['error']['message'] != ''"
run gen_busy_h generate --target "$T" --prompt-ids 1 --max-tokens 5 --request-id busy
expect_rc 1 "generate, busy (human)"
expect_in "generate, busy (human): pushback" "RESOURCE_EXHAUSTED" "$ERR"
expect_in "generate, busy (human): pushback" "retry after 250 ms" "$ERR"
[ -z "$OUT" ] && ok || fail "generate, busy (human): unexpected stdout $OUT"

# ---- loads, info, health ----
run loads loads --target "$T" --json
expect_rc 0 "loads --json"
jcheck "loads --json" "list(d) == ['slots_total', 'slots_used', 'waiting', 'queue_capacity', 'tokens_in_flight', 'draining', 'handoffs_pending'] and d['slots_total'] == 8 and d['queue_capacity'] == 32 and d['draining'] is False"
run loads_h loads --target "$T"
expect_rc 0 "loads (human)"
expect_in "loads (human)" "slots_total: 8" "$OUT"

run info info --target "$T" --json
expect_rc 0 "info --json"
jcheck "info --json" "len(d) == 16 and d['vocab_size'] == 1000 and d['commit_mode'] == 'deferred' and d['max_model_len'] == 4096 and d['version'] == 'fake-0.1' and d['max_message_bytes'] == 4194304"
run info_h info --target "$T"
expect_rc 0 "info (human)"
expect_in "info (human)" "model_fingerprint: 00ff" "$OUT"

run health health --target "$T"
expect_rc 0 "health"
[ "$OUT" = "SERVING" ] && ok || fail "health: printed \"$OUT\", want SERVING"
run health_json health --target "$T" --service kdecode.v1.Decoder --json
expect_rc 0 "health --json"
jcheck "health --json" "d == {'status': 'SERVING'}"
run health_ns health --target "$T" --service kdecode.v1.Draining
expect_rc 1 "health NOT_SERVING"
[ "$OUT" = "NOT_SERVING" ] && ok || fail "health NOT_SERVING: printed \"$OUT\""
run health_unknown health --target "$T" --service no.such.Service --json
expect_rc 1 "health, unknown service"
jcheck "health, unknown service" "d['error']['name'] == 'NOT_FOUND'"

# ---- abort ----
run abort_unknown abort --target "$T" --request-id nope --json
expect_rc 1 "abort, unknown id"
jcheck "abort, unknown id" "d['error']['code'] == 5 and d['error']['name'] == 'NOT_FOUND'"

# A slow request (50 ms per chunk) aborted while it streams.
"$KDCTL" generate --target "$T" --prompt-ids 1,1 --max-tokens 400 --request-id slow-1 --json \
    >"$TMP/slow.out" 2>"$TMP/slow.err" &
SLOW=$!
for i in $(seq 1 100); do grep -q '"slow-1"' "$TMP/plain.log" 2>/dev/null && break; sleep 0.05; done
sleep 0.2
run loads_busy loads --target "$T" --json
jcheck "loads with a live request" "d['slots_used'] == 1"
run abort_live abort --target "$T" --request-id slow-1 --json
expect_rc 0 "abort of a live request"
jcheck "abort --json" "d == {}"
wait "$SLOW"
RC=$?
OUT=$(cat "$TMP/slow.out")
ERR=$(cat "$TMP/slow.err")
expect_rc 0 "generate, aborted"
jcheck "generate, aborted" "d['finish'] == 'abort' and 0 < len(d['tokens']) < 400 and d['tokens'] == $(fake_tokens 1,1 400)[:len(d['tokens'])]"

# A deadline that passes mid-stream.
run deadline generate --target "$T" --prompt-ids 1 --max-tokens 400 --request-id slow-deadline --timeout 0.3 --json
expect_rc 1 "generate past its deadline"
jcheck "generate past its deadline" "d['error']['code'] == 4 and d['error']['name'] == 'DEADLINE_EXCEEDED'"

# SIGINT stops a load (no new requests); a second SIGINT cancels the calls in flight.
echo '[{"prompt_token_ids": [1], "max_tokens": 400, "request_id": "slow-int-{{.RequestNumber}}"}]' >"$TMP/slow.json"
"$KDCTL" load --target "$T" --data "$TMP/slow.json" --concurrency 2 --duration 60 --json \
    >"$TMP/sigint.out" 2>"$TMP/sigint.err" &
LOADPID=$!
sleep 1
kill -INT "$LOADPID"
sleep 0.2
kill -INT "$LOADPID"
wait "$LOADPID"
RC=$?
OUT=$(cat "$TMP/sigint.out")
ERR=$(cat "$TMP/sigint.err")
expect_rc 1 "load interrupted twice (no request succeeded)"
jcheck "load interrupted twice" "d['errors'] == {'CANCELLED': 2} and d['elapsed_seconds'] < 5"

# ---- connection failure ----
run refused loads --target 127.0.0.1:1 --json --timeout 5
expect_rc 1 "loads, connection refused"
jcheck "loads, connection refused" "d['error']['name'] == 'UNAVAILABLE'"

# ---- load ----
cat >"$TMP/data.json" <<'EOF'
[
  {"promptTokenIds": [1, 2, 3], "maxTokens": 8, "requestId": "ghz-{{.RequestNumber}}"},
  {"prompt_token_ids": [5, 6], "max_tokens": 5, "request_id": "w{{.WorkerID}}-{{ .RequestNumber }}",
   "sampling": {"temperature": 0.7, "topK": 5, "top_p": 0.9, "seed": "42"},
   "speculation": {"numDraftTokens": 3, "source": "DRAFT_SOURCE_NGRAM"}, "stopTokenIds": [999], "ignoreEos": true},
  {"prompt_token_ids": [], "max_tokens": 4},
  {"prompt_token_ids": [9], "max_tokens": 4, "request_id": "busy"}
]
EOF
: >"$TMP/plain.log"
run load load --target "$T" --data "$TMP/data.json" --concurrency 4 --duration 2 --json
expect_rc 0 "load --data"
jcheck "load: counts" "d['requests']['ok'] > 0 and d['requests']['failed'] > 0 and d['requests']['total'] == d['requests']['ok'] + d['requests']['failed'] and sum(d['status'].values()) == d['requests']['total']"
jcheck "load: errors by code" "d['errors']['INVALID_ARGUMENT'] > 0 and d['errors']['RESOURCE_EXHAUSTED'] > 0 and sum(d['errors'].values()) == d['requests']['failed'] and 'at least one token' in d['error_messages']['INVALID_ARGUMENT']"
jcheck "load: percentiles ordered" "all(d['latency_ms'][k]['count'] > 0 and d['latency_ms'][k]['min'] <= d['latency_ms'][k]['p50'] <= d['latency_ms'][k]['p90'] <= d['latency_ms'][k]['p99'] <= d['latency_ms'][k]['max'] for k in ('ttft', 'itl', 'e2e'))"
jcheck "load: throughput" "d['throughput']['requests_per_second'] > 0 and d['throughput']['tokens_per_second'] > 0 and d['tokens']['generated'] > 0 and d['mode'] == 'closed' and d['concurrency'] == 4 and 1.9 < d['elapsed_seconds'] < 10"
jcheck "load: finish" "d['finish']['length'] == d['requests']['ok']"
OUT=$("$PY" -c 'import json, sys
reqs = [json.loads(l)["request"] for l in open(sys.argv[1]) if "Generate" in l]
ids = [r.get("request_id", "") for r in reqs]
named = [i for i in ids if i and i != "busy"]
d = {"n": len(reqs), "named": len(named), "unique": len(set(named)), "braces": sum("{" in i for i in ids),
     "ghz": sum(i.startswith("ghz-") for i in ids),
     "second": [r for r in reqs if r.get("prompt_token_ids") == [5, 6]][:1]}
print(json.dumps(d))' "$TMP/plain.log")
jcheck "load: ghz templates expanded to unique ids" "d['n'] > 8 and d['named'] == d['unique'] and d['braces'] == 0 and d['ghz'] > 0"
jcheck "load: data entry on the wire" "d['second'][0]['sampling'] == {'temperature': 0.7, 'top_k': 5, 'top_p': 0.9, 'seed': '42'} and d['second'][0]['speculation'] == {'num_draft_tokens': 3, 'source': 'DRAFT_SOURCE_NGRAM'} and d['second'][0]['stop_token_ids'] == [999] and d['second'][0]['ignore_eos'] is True"

run load_h load --target "$T" --data "$TMP/data.json" --concurrency 2 --duration 0.5
expect_rc 0 "load (human)"
expect_in "load (human) table" "p99" "$OUT"
expect_in "load (human) errors" "RESOURCE_EXHAUSTED" "$OUT"

# Open loop, random prompts (vocabulary from GetServerInfo), --max-tokens from the flags.
: >"$TMP/plain.log"
run load_open load --target "$T" --concurrency 2 --rate 40 --duration 1 --max-tokens 4 --prompt-len 5 --json
expect_rc 0 "load --rate"
jcheck "load --rate" "d['mode'] == 'open' and d['rate'] == 40 and d['requests']['ok'] > 5 and d['requests']['failed'] == 0 and 'lateness_ms' in d and d['lateness_ms']['count'] == d['requests']['total'] and d['late_requests'] >= 0"
OUT=$("$PY" -c 'import json, sys
reqs = [json.loads(l)["request"] for l in open(sys.argv[1]) if "Generate" in l]
print(json.dumps({"n": len(reqs), "ok": all(len(r["prompt_token_ids"]) == 5 and r["max_tokens"] == 4 and all(0 <= t < 1000 for t in r["prompt_token_ids"]) for r in reqs)}))' "$TMP/plain.log")
jcheck "load --rate: random prompts in the vocabulary" "d['n'] > 5 and d['ok']"

run load_n load --target "$T" --concurrency 3 --requests 10 --vocab 50 --prompt-ids 4,4 --max-tokens 3 --json
expect_rc 0 "load --requests"
jcheck "load --requests" "d['requests']['total'] == 10 and d['requests']['ok'] == 10 and d['tokens']['generated'] == 30"

run load_allbad load --target "$T" --concurrency 1 --requests 3 --prompt-ids "" --max-tokens 3 --json
expect_rc 1 "load, every request failed"
jcheck "load, every request failed" "d['errors'] == {'INVALID_ARGUMENT': 3}"

# ---- TLS and mutual TLS ----
(
    cd "$TMP" || exit 1
    ec="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
    $OPENSSL req -x509 $ec -keyout ca.key -out ca.pem -days 2 -subj /CN=kdctl-test-ca \
        -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign &&
    $OPENSSL req -x509 $ec -keyout other-ca.key -out other-ca.pem -days 2 -subj /CN=other-ca \
        -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign &&
    $OPENSSL req $ec -keyout server.key -out server.csr -subj /CN=kd-worker &&
    $OPENSSL req $ec -keyout client.key -out client.csr -subj /CN=kd-client &&
    printf 'subjectAltName=DNS:localhost,IP:127.0.0.1,DNS:kd-worker.internal\nextendedKeyUsage=serverAuth\n' >server.ext &&
    printf 'extendedKeyUsage=clientAuth\n' >client.ext &&
    $OPENSSL x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -out server.pem -extfile server.ext &&
    $OPENSSL x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -out client.pem -extfile client.ext
) >"$TMP/openssl.log" 2>&1 || { fail "openssl: $(cat "$TMP/openssl.log")"; exit 1; }

start_fake tls --tls-cert "$TMP/server.pem" --tls-key "$TMP/server.key"
start_fake mtls --tls-cert "$TMP/server.pem" --tls-key "$TMP/server.key" --tls-client-ca "$TMP/ca.pem"
TT="127.0.0.1:$PORT_tls"
MT="127.0.0.1:$PORT_mtls"

run tls_health health --target "$TT" --tls-ca "$TMP/ca.pem"
expect_rc 0 "TLS health"
run tls_gen generate --target "$TT" --tls-ca "$TMP/ca.pem" --prompt-ids 3,3 --max-tokens 6 --json
expect_rc 0 "TLS generate"
jcheck "TLS generate" "d['tokens'] == $(fake_tokens 3,3 6)"
run tls_name health --target "$TT" --tls-ca "$TMP/ca.pem" --tls-server-name kd-worker.internal
expect_rc 0 "TLS --tls-server-name (a SAN of the certificate)"
run tls_badname health --target "$TT" --tls-ca "$TMP/ca.pem" --tls-server-name wrong.example --json --timeout 5
expect_rc 1 "TLS --tls-server-name not in the certificate"
jcheck "TLS wrong name" "d['error']['name'] == 'UNAVAILABLE'"
run tls_otherca health --target "$TT" --tls-ca "$TMP/other-ca.pem" --timeout 5
expect_rc 1 "TLS with the wrong CA"
run tls_plain health --target "$TT" --timeout 5
expect_rc 1 "plaintext client, TLS server"

run mtls_gen generate --target "$MT" --tls-ca "$TMP/ca.pem" --tls-cert "$TMP/client.pem" --tls-key "$TMP/client.key" \
    --prompt-ids 8 --max-tokens 5 --json
expect_rc 0 "mTLS generate"
jcheck "mTLS generate" "d['tokens'] == $(fake_tokens 8 5)"
run mtls_load load --target "$MT" --tls-ca "$TMP/ca.pem" --tls-cert "$TMP/client.pem" --tls-key "$TMP/client.key" \
    --concurrency 2 --requests 6 --prompt-ids 1 --max-tokens 3 --json
expect_rc 0 "mTLS load"
jcheck "mTLS load" "d['requests']['ok'] == 6"
run mtls_nocert generate --target "$MT" --tls-ca "$TMP/ca.pem" --prompt-ids 8 --max-tokens 5 --json --timeout 5
expect_rc 1 "mTLS without a client certificate"
jcheck "mTLS without a client certificate" "d['error']['name'] == 'UNAVAILABLE'"
run mtls_missing health --target "$MT" --tls-ca "$TMP/no-such-ca.pem"
expect_rc 1 "TLS, CA file missing"
expect_in "TLS, CA file missing" "no-such-ca.pem" "$ERR"

# ---- strict flag parsing: exit 2 ----
echo '[{"prompt_token_ids": [1], "max_tokens": 2, "temprature": 1}]' >"$TMP/typo.json"
echo '[{"prompt_token_ids": [1], ' >"$TMP/broken.json"
echo '[{"prompt_token_ids": [1], "speculation": {"source": "DRAFT_SOURCE_BOGUS"}}]' >"$TMP/badenum.json"
bad() {
    local what=$1
    shift
    run bad "$@"
    expect_rc 2 "bad flags: $what"
    [ -n "$ERR" ] && ok || fail "bad flags: $what: no message"
}
bad "no command"
bad "unknown command" frobnicate --target "$T"
bad "unknown flag" loads --target "$T" --bogus
bad "missing value" generate --target "$T" --prompt-ids 1 --max-tokens
bad "flag as value" generate --target "$T" --prompt-ids --max-tokens 3
bad "bad number" generate --target "$T" --prompt-ids 1 --max-tokens abc
bad "fraction for an integer" generate --target "$T" --prompt-ids 1 --max-tokens 1.5
bad "trailing junk" generate --target "$T" --prompt-ids 1 --max-tokens 3 --temperature 0.5x
bad "bad id list" generate --target "$T" --prompt-ids 1,,2 --max-tokens 3
bad "negative id" generate --target "$T" --prompt-ids 1,-2 --max-tokens 3
bad "out of range" load --target "$T" --concurrency 0 --duration 1
bad "top-p > 1" generate --target "$T" --prompt-ids 1 --max-tokens 3 --top-p 1.5
bad "bad choice" generate --target "$T" --prompt-ids 1 --max-tokens 3 --draft bogus
bad "bool with a value" loads --target "$T" --json=yes
bad "flag of another command" generate --target "$T" --prompt-ids 1 --max-tokens 3 --service x
bad "positional argument" loads --target "$T" extra
bad "flag twice" loads --target "$T" --target "$T"
bad "no --target" loads
bad "generate without --prompt-ids" generate --target "$T" --max-tokens 3
bad "abort without --request-id" abort --target "$T"
bad "load without --duration" load --target "$T" --concurrency 2
bad "--tls-cert without --tls-ca" health --target "$T" --tls-cert "$TMP/client.pem" --tls-key "$TMP/client.key"
bad "--tls-cert without --tls-key" health --target "$T" --tls-ca "$TMP/ca.pem" --tls-cert "$TMP/client.pem"
bad "--data unknown field" load --target "$T" --concurrency 1 --duration 1 --data "$TMP/typo.json"
bad "--data not JSON" load --target "$T" --concurrency 1 --duration 1 --data "$TMP/broken.json"
bad "--data bad enum" load --target "$T" --concurrency 1 --duration 1 --data "$TMP/badenum.json"
bad "--data missing" load --target "$T" --concurrency 1 --duration 1 --data "$TMP/none.json"
run help --help
expect_rc 0 "--help"
expect_in "--help" "--concurrency" "$OUT"
run help2 generate --help
expect_rc 0 "generate --help"
run eqform generate --target="$T" --prompt-ids=1,2 --max-tokens=2 --json
expect_rc 0 "--flag=value form"
jcheck "--flag=value form" "d['tokens'] == $(fake_tokens 1,2 2)"

echo "kdctl_test: $CHECKS checks passed, $FAILS failed"
[ "$FAILS" -eq 0 ]
