#!/bin/bash
# node_test.sh: runs node/client_test.js (Node.js, @grpc/grpc-js + @grpc/proto-loader) against
# `kdecode serve`. node_modules lives in the source tree (tests/service/node/node_modules,
# installed by deploy/setup.sh), found through the runfiles symlink of node/package.json.
# Outside Bazel set KDECODE_BIN, KDECODE_MODEL and KDECODE_NODE_DIR (tests/service/node).
# Arguments: --time-scale=F stretches every wait (sanitizers).
set -u

find_runfile() {
    local c
    for c in "${TEST_SRCDIR:-}/kdecode/$1" "${RUNFILES_DIR:-}/kdecode/$1"; do
        if [ -e "$c" ]; then echo "$c"; return 0; fi
    done
    return 1
}

for a in "$@"; do
    case $a in
        --time-scale=*) export KDECODE_TIME_SCALE=${a#*=} ;;
        *) echo "node_test.sh: unknown argument $a" >&2; exit 2 ;;
    esac
done

if [ -z "${KDECODE_NODE_DIR:-}" ]; then
    pj=$(find_runfile tests/service/node/package.json) || pj=$(dirname "$0")/node/package.json
    [ -f "$pj" ] || { echo "FAIL: tests/service/node/package.json not found (set KDECODE_NODE_DIR)"; exit 1; }
    KDECODE_NODE_DIR=$(dirname "$(readlink -f "$pj")")
fi
if [ ! -f "$KDECODE_NODE_DIR/node_modules/@grpc/grpc-js/package.json" ] ||
   [ ! -f "$KDECODE_NODE_DIR/node_modules/@grpc/proto-loader/package.json" ]; then
    echo "FAIL: the Node test dependencies are not installed in $KDECODE_NODE_DIR/node_modules."
    echo "      Run deploy/setup.sh (it runs: npm ci --prefix tests/service/node)."
    exit 1
fi
command -v node >/dev/null || { echo "FAIL: node is not on PATH ($PATH)"; exit 1; }

KDECODE_BIN=${KDECODE_BIN:-$(find_runfile worker/kdecode)} ||
    { echo "FAIL: worker/kdecode not in the runfiles (outside Bazel set KDECODE_BIN)"; exit 1; }
if [ -z "${KDECODE_MODEL:-}" ]; then
    cfg=$(find_runfile deploy/demo-model/config.json) ||
        { echo "FAIL: deploy/demo-model not in the runfiles (outside Bazel set KDECODE_MODEL)"; exit 1; }
    KDECODE_MODEL=$(dirname "$cfg")
fi
if [ -z "${KDECODE_PROTO_ROOT:-}" ]; then
    p=$(find_runfile proto/kdecode/v1/decoder.proto) || p=$(dirname "$0")/../../proto/kdecode/v1/decoder.proto
    KDECODE_PROTO_ROOT=${p%/kdecode/v1/decoder.proto}
fi
JS=$(find_runfile tests/service/node/client_test.js) || JS=$KDECODE_NODE_DIR/client_test.js
export KDECODE_BIN KDECODE_MODEL KDECODE_PROTO_ROOT NODE_PATH=$KDECODE_NODE_DIR/node_modules

unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY grpc_proxy all_proxy ALL_PROXY
export no_proxy='*'

echo "node_test: $(node --version), modules from $NODE_PATH"
exec node "$JS"
