/* server.h: `kdecode serve`, the gRPC decode worker (DESIGN.md "Data flow", "API").
 *
 * Completion-queue threads accept calls, decode and validate requests and hand them to one
 * engine thread through a command queue; the engine thread owns the model state, steps the
 * engine and hands token events back to the calls, which stream them out. Implements
 * kdecode.v1.Decoder, grpc.health.v1.Health (Check, Watch) and server reflection (v1 and
 * v1alpha); anything else is UNIMPLEMENTED. SIGTERM/SIGINT drain: readiness goes
 * NOT_SERVING, new requests get UNAVAILABLE, running ones finish within --drain-seconds,
 * then the process exits 0; a second signal exits at once. */
#ifndef KD_SERVER_H
#define KD_SERVER_H

int kd_serve_main(int argc, char **argv);

#endif
