#!/bin/bash
# handoff_test.sh: runs handoff_test.py (unittest, /usr/bin/python3 with Debian's grpcio and
# protobuf) against `kdecode serve` processes on loopback. Finds the binaries, the bundled
# demo model and decoder.proto in the runfiles; outside Bazel set KDECODE_BIN, KDCTL_BIN,
# KDECODE_MODEL and KDECODE_PROTO. Arguments: --time-scale=F stretches every wait
# (sanitizers); anything else goes to unittest (a test name, -k PATTERN).
set -u

find_runfile() {
    local c
    for c in "${TEST_SRCDIR:-}/kdecode/$1" "${RUNFILES_DIR:-}/kdecode/$1" "$0.runfiles/kdecode/$1"; do
        if [ -e "$c" ]; then echo "$c"; return 0; fi
    done
    return 1
}

args=()
for a in "$@"; do
    case $a in
        --time-scale=*) export KDECODE_TIME_SCALE=${a#*=} ;;
        *) args+=("$a") ;;
    esac
done

KDECODE_BIN=${KDECODE_BIN:-$(find_runfile worker/kdecode)} ||
    { echo "FAIL: worker/kdecode not in the runfiles (outside Bazel set KDECODE_BIN)"; exit 1; }
KDCTL_BIN=${KDCTL_BIN:-$(find_runfile worker/kdctl)} ||
    { echo "FAIL: worker/kdctl not in the runfiles (outside Bazel set KDCTL_BIN)"; exit 1; }
if [ -z "${KDECODE_MODEL:-}" ]; then
    cfg=$(find_runfile deploy/demo-model/config.json) ||
        { echo "FAIL: deploy/demo-model not in the runfiles (outside Bazel set KDECODE_MODEL)"; exit 1; }
    KDECODE_MODEL=$(dirname "$cfg")
fi
KDECODE_PROTO=${KDECODE_PROTO:-$(find_runfile proto/kdecode/v1/decoder.proto)} ||
    { echo "FAIL: decoder.proto not in the runfiles (outside Bazel set KDECODE_PROTO)"; exit 1; }
PY_TEST=$(find_runfile tests/handoff/handoff_test.py) || PY_TEST=$(dirname "$0")/handoff_test.py
export KDECODE_BIN KDCTL_BIN KDECODE_MODEL KDECODE_PROTO

# Loopback only; a proxy from the environment must not capture 127.0.0.1.
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY grpc_proxy all_proxy ALL_PROXY
export no_proxy='*'

exec /usr/bin/python3 -u "$PY_TEST" -v ${args[@]+"${args[@]}"}
