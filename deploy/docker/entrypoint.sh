#!/bin/sh
# The container's entrypoint: `kdecode serve` with the flags of a directory that holds one
# file per flag (the Kubernetes ConfigMap of deploy/k8s, mounted read-only; the image
# ships defaults in the same place). A file NAME holding VALUE becomes `--NAME VALUE`;
# "true" makes a bare switch (`--log-json`), "false" or an empty file leaves the flag out.
# Files are read in name order; the container's arguments come after them, so a flag given
# there wins (getopt: the last occurrence counts).
#
#   KDECODE_FLAGS_DIR  the directory (default /etc/kdecode/flags; missing: no flags)
#   KDECODE_BIN        the program (default /usr/local/bin/kdecode)
#
# `exec` keeps kdecode as PID 1, so SIGTERM from the kubelet reaches it and starts the
# drain (readiness NOT_SERVING, new calls UNAVAILABLE, running requests finish, exit 0).
set -eu

dir=${KDECODE_FLAGS_DIR:-/etc/kdecode/flags}
bin=${KDECODE_BIN:-/usr/local/bin/kdecode}

# Append the directory's flags after the container's arguments, then rotate those
# arguments to the end (POSIX sh has one array: "$@").
n=$#
if [ -d "$dir" ]; then
    for f in "$dir"/*; do
        [ -f "$f" ] || continue # the glob matched nothing, or a subdirectory
        name=${f##*/}
        case $name in
            *[!a-z0-9-]* | -*)
                echo "kdecode-entrypoint: $f: not a flag name (want [a-z0-9-]+)" >&2
                exit 2
                ;;
        esac
        value=$(cat "$f") # drops trailing newlines
        case $value in
            true) set -- "$@" "--$name" ;;
            false | '') ;;
            *) set -- "$@" "--$name" "$value" ;;
        esac
    done
elif [ -n "${KDECODE_FLAGS_DIR:-}" ]; then
    echo "kdecode-entrypoint: KDECODE_FLAGS_DIR=$dir is not a directory" >&2
    exit 2
fi
while [ "$n" -gt 0 ]; do
    set -- "$@" "$1"
    shift
    n=$((n - 1))
done

exec "$bin" serve "$@"
