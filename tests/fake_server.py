#!/usr/bin/python3
"""fake_server.py: a tiny fake kdecode worker (Decoder + Health) for testing clients.

Not a model: Generate streams deterministic tokens, token i = (sum(prompt) + i) % 1000 for
i = 0 .. max_tokens-1, in chunks of 1, 2, 3, 1, 2, 3, ... tokens, stopping after a token of
stop_token_ids (finish STOP) or at max_tokens (finish LENGTH). Errors:
  empty prompt (and no handoff_id), max_tokens < 1   INVALID_ARGUMENT
  request_id "busy"                  RESOURCE_EXHAUSTED, trailer grpc-retry-pushback-ms: 250
  request_id of a live request       ALREADY_EXISTS
  Abort of an unknown request_id     NOT_FOUND
A request_id starting with "slow" sleeps 50 ms per chunk (so it can be aborted). Health:
"" and "kdecode.v1.Decoder" SERVING, "kdecode.v1.Draining" NOT_SERVING, others NOT_FOUND.

Usage: fake_server.py --proto-dir DIR [--tls-cert PEM --tls-key PEM [--tls-client-ca PEM]]
                      [--log FILE]
The _pb2 modules are generated into a temporary directory with protoc from DIR
(kdecode/v1/decoder.proto, grpc/health/v1/health.proto). Prints the bound port on stdout
(127.0.0.1, an ephemeral port), then serves until SIGTERM/SIGINT. --log appends every
request as one JSON line {"method": ..., "request": {...}} (proto field names).
Run with /usr/bin/python3 (Debian's grpcio and protobuf).
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import grpc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--proto-dir", required=True)
    ap.add_argument("--tls-cert")
    ap.add_argument("--tls-key")
    ap.add_argument("--tls-client-ca", help="require client certificates signed by this CA")
    ap.add_argument("--log")
    args = ap.parse_args()

    # The generated health module lives in package grpc.health.v1, which would clash with
    # the real grpc package: import it under its own top-level name instead.
    gen = tempfile.mkdtemp(prefix="kd_fake_pb2_")
    subprocess.run(["/usr/bin/protoc", "--python_out=" + gen, "--proto_path=" + args.proto_dir,
                    "kdecode/v1/decoder.proto", "grpc/health/v1/health.proto"], check=True)
    import importlib.util

    def load(name, rel):
        spec = importlib.util.spec_from_file_location(name, os.path.join(gen, rel))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    pb = load("kd_decoder_pb2", "kdecode/v1/decoder_pb2.py")
    hpb = load("kd_health_pb2", "grpc/health/v1/health_pb2.py")
    from google.protobuf import json_format

    log_lock = threading.Lock()
    log_f = open(args.log, "a") if args.log else None

    def log(method, req):
        if not log_f:
            return
        d = json_format.MessageToDict(req, preserving_proto_field_name=True)
        with log_lock:
            log_f.write(json.dumps({"method": method, "request": d}) + "\n")
            log_f.flush()

    live = {}  # request_id -> threading.Event (set by Abort)
    live_lock = threading.Lock()
    counter = [0]

    def generate(req, ctx):
        log("Generate", req)
        if len(req.prompt_token_ids) == 0 and not req.handoff_id:
            ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "prompt_token_ids: at least one token")
        if req.max_tokens < 1:
            ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "max_tokens: must be at least 1")
        if req.request_id == "busy":
            ctx.set_trailing_metadata((("grpc-retry-pushback-ms", "250"),))
            ctx.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "no free slot and the queue is full")
        rid = req.request_id
        ev = threading.Event()
        with live_lock:
            if not rid:
                counter[0] += 1
                rid = "fake-%d" % counter[0]
            if rid in live:
                ctx.abort(grpc.StatusCode.ALREADY_EXISTS, "request_id %r is live" % rid)
            live[rid] = ev
        try:
            t0 = time.monotonic()
            base = sum(req.prompt_token_ids)
            stops = set(req.stop_token_ids)
            spec = req.speculation.num_draft_tokens if req.HasField("speculation") else 0
            i, chunk, steps, ttft = 0, 0, 0, 0.0
            first = True
            while True:
                time.sleep(0.05 if rid.startswith("slow") else 0.001)
                if ev.is_set():
                    finish = pb.FINISH_REASON_ABORT
                    r = pb.GenerateResponse()
                    break
                if not ctx.is_active():
                    return
                n = chunk % 3 + 1
                chunk += 1
                steps += 1
                toks, stopped = [], False
                while len(toks) < n and i < req.max_tokens and not stopped:
                    t = (base + i) % 1000
                    toks.append(t)
                    i += 1
                    stopped = t in stops
                if first:
                    ttft = time.monotonic() - t0
                r = pb.GenerateResponse(token_ids=toks)
                if stopped or i >= req.max_tokens:
                    finish = pb.FINISH_REASON_STOP if stopped else pb.FINISH_REASON_LENGTH
                    break
                if first:
                    r.request_id = rid
                    first = False
                yield r
            if first:
                r.request_id = rid
            r.finish_reason = finish
            r.usage.CopyFrom(pb.Usage(
                prompt_tokens=len(req.prompt_token_ids), completion_tokens=i, cached_tokens=0,
                drafted_tokens=spec * steps, accepted_tokens=min(spec * steps, max(0, i - steps)),
                steps=steps, queue_seconds=0.0, time_to_first_token_seconds=ttft,
                total_seconds=time.monotonic() - t0))
            yield r
        finally:
            with live_lock:
                live.pop(rid, None)

    def abort(req, ctx):
        log("Abort", req)
        with live_lock:
            ev = live.get(req.request_id)
        if ev is None:
            ctx.abort(grpc.StatusCode.NOT_FOUND, "no live request %r" % req.request_id)
        ev.set()
        return pb.AbortResponse()

    def get_loads(req, ctx):
        log("GetLoads", req)
        with live_lock:
            n = len(live)
        return pb.Loads(slots_total=8, slots_used=min(n, 8), waiting=max(0, n - 8), queue_capacity=32,
                        tokens_in_flight=17 * n, draining=False, handoffs_pending=0)

    def get_server_info(req, ctx):
        log("GetServerInfo", req)
        return pb.ServerInfo(version="fake-0.1", model_fingerprint="00ff" * 8, role="decode", backend="cpu",
                             vocab_size=1000, num_layers=4, hidden_size=256, eos_token_id=2, max_seqs=8,
                             max_queue=32, max_model_len=4096, max_spec_tokens=8, default_spec_tokens=3,
                             prefix_block=64, commit_mode="deferred", max_message_bytes=4 << 20)

    def check(req, ctx):
        log("Check", req)
        S = hpb.HealthCheckResponse
        if req.service in ("", "kdecode.v1.Decoder"):
            return S(status=S.SERVING)
        if req.service == "kdecode.v1.Draining":
            return S(status=S.NOT_SERVING)
        ctx.abort(grpc.StatusCode.NOT_FOUND, "unknown service %r" % req.service)

    def unary(fn, req_cls, resp_cls):
        return grpc.unary_unary_rpc_method_handler(fn, request_deserializer=req_cls.FromString,
                                                   response_serializer=resp_cls.SerializeToString)

    decoder = grpc.method_handlers_generic_handler("kdecode.v1.Decoder", {
        "Generate": grpc.unary_stream_rpc_method_handler(
            generate, request_deserializer=pb.GenerateRequest.FromString,
            response_serializer=pb.GenerateResponse.SerializeToString),
        "Abort": unary(abort, pb.AbortRequest, pb.AbortResponse),
        "GetLoads": unary(get_loads, pb.GetLoadsRequest, pb.Loads),
        "GetServerInfo": unary(get_server_info, pb.GetServerInfoRequest, pb.ServerInfo),
    })
    health = grpc.method_handlers_generic_handler("grpc.health.v1.Health", {
        "Check": unary(check, hpb.HealthCheckRequest, hpb.HealthCheckResponse),
    })

    from concurrent import futures
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32), handlers=(decoder, health),
                         options=(("grpc.so_reuseport", 0),))
    if args.tls_cert:
        with open(args.tls_key, "rb") as f:
            key = f.read()
        with open(args.tls_cert, "rb") as f:
            cert = f.read()
        ca = None
        if args.tls_client_ca:
            with open(args.tls_client_ca, "rb") as f:
                ca = f.read()
        creds = grpc.ssl_server_credentials([(key, cert)], root_certificates=ca,
                                            require_client_auth=ca is not None)
        port = server.add_secure_port("127.0.0.1:0", creds)
    else:
        port = server.add_insecure_port("127.0.0.1:0")
    if not port:
        print("fake_server: cannot bind 127.0.0.1:0", file=sys.stderr)
        return 1
    server.start()
    print(port, flush=True)

    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    while not done.wait(0.2):
        pass
    server.stop(0.5).wait()
    shutil.rmtree(gen, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
