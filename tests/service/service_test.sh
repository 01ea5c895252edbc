#!/bin/bash
# service_test.sh: runs service_test.py (unittest, /usr/bin/python3 with Debian's grpcio and
# protobuf) against `kdecode serve` processes on loopback. Finds the binary, the bundled demo
# model and the generated _pb2 modules in the runfiles; outside Bazel set KDECODE_BIN,
# KDECODE_MODEL and KDECODE_PB. Arguments: --time-scale=F stretches every wait (sanitizers);
# others name test classes or tests to run (e.g. GenerateTest.test_stop_token), as unittest
# takes them.
set -u

find_runfile() {
    local c
    for c in "${TEST_SRCDIR:-}/kdecode/$1" "${RUNFILES_DIR:-}/kdecode/$1"; do
        if [ -e "$c" ]; then echo "$c"; return 0; fi
    done
    return 1
}

names=()
for a in "$@"; do
    case $a in
        --time-scale=*) export KDECODE_TIME_SCALE=${a#*=} ;;
        -*) echo "service_test.sh: unknown argument $a" >&2; exit 2 ;;
        *) names+=("$a") ;;
    esac
done

KDECODE_BIN=${KDECODE_BIN:-$(find_runfile worker/kdecode)} ||
    { echo "FAIL: worker/kdecode not in the runfiles (outside Bazel set KDECODE_BIN)"; exit 1; }
if [ -z "${KDECODE_MODEL:-}" ]; then
    cfg=$(find_runfile deploy/demo-model/config.json) ||
        { echo "FAIL: deploy/demo-model not in the runfiles (outside Bazel set KDECODE_MODEL)"; exit 1; }
    KDECODE_MODEL=$(dirname "$cfg")
fi
if [ -z "${KDECODE_PB:-}" ]; then
    pb=$(find_runfile tests/service/pb/kdecode/v1/decoder_pb2.py) ||
        { echo "FAIL: the generated _pb2 modules are not in the runfiles (outside Bazel set KDECODE_PB)"; exit 1; }
    KDECODE_PB=${pb%/kdecode/v1/decoder_pb2.py}
fi
PY_TEST=$(find_runfile tests/service/service_test.py) || PY_TEST=$(dirname "$0")/service_test.py
export KDECODE_BIN KDECODE_MODEL KDECODE_PB

# The tests only need loopback; a proxy from the environment must not capture 127.0.0.1.
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY grpc_proxy all_proxy ALL_PROXY
export no_proxy='*'

exec /usr/bin/python3 -u "$PY_TEST" -v "${names[@]}"
