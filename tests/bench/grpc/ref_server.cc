// ref_server: the reference for the gRPC benchmark. A plain C++ gRPC server (Debian's
// libgrpc++ 1.51, synchronous API, default settings) with the same two methods kdecode is
// measured on, and no model behind them:
//   grpc.health.v1.Health/Check   SERVING for "" and "kdecode.v1.Decoder", else NOT_FOUND
//   kdecode.v1.Decoder/Generate   max_tokens canned tokens, one message each; the last one
//                                 carries finish_reason LENGTH and the usage, written together
//                                 with the status (as kdecode does)
// Everything else is UNIMPLEMENTED. Prints {"port":N} on stdout once it listens; SIGTERM or
// SIGINT shuts it down.
//
// usage: ref_server [--listen HOST:PORT]   (default 127.0.0.1:0: any free port)
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "grpc/health/v1/health.grpc.pb.h"
#include "kdecode/v1/decoder.grpc.pb.h"

namespace {

namespace health = grpc::health::v1;
namespace kd = kdecode::v1;

class HealthService final : public health::Health::Service {
    grpc::Status Check(grpc::ServerContext *, const health::HealthCheckRequest *req,
                       health::HealthCheckResponse *resp) override {
        if (!req->service().empty() && req->service() != "kdecode.v1.Decoder")
            return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service");
        resp->set_status(health::HealthCheckResponse::SERVING);
        return grpc::Status::OK;
    }
};

class DecoderService final : public kd::Decoder::Service {
    grpc::Status Generate(grpc::ServerContext *ctx, const kd::GenerateRequest *req,
                          grpc::ServerWriter<kd::GenerateResponse> *writer) override {
        if (req->prompt_token_ids_size() == 0)
            return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "prompt_token_ids is empty");
        if (req->max_tokens() < 1)
            return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "max_tokens must be at least 1");
        const auto t0 = std::chrono::steady_clock::now();
        const int n = req->max_tokens();
        const int32_t first = req->prompt_token_ids(req->prompt_token_ids_size() - 1);
        kd::GenerateResponse r;
        for (int i = 0; i < n; i++) {
            if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
            r.Clear();
            r.add_token_ids((first + 7 * (i + 1)) & 511); // canned: no model
            if (i == 0) r.set_request_id(req->request_id().empty() ? "ref" : req->request_id());
            if (i == n - 1) {
                r.set_finish_reason(kd::FINISH_REASON_LENGTH);
                kd::Usage *u = r.mutable_usage();
                u->set_prompt_tokens(req->prompt_token_ids_size());
                u->set_completion_tokens(n);
                u->set_steps(n);
                u->set_total_seconds(
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
                writer->WriteLast(r, grpc::WriteOptions());
            } else if (!writer->Write(r)) {
                return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
            }
        }
        return grpc::Status::OK;
    }
};

} // namespace

int main(int argc, char **argv) {
    std::string listen = "127.0.0.1:0";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--listen") && i + 1 < argc) {
            listen = argv[++i];
        } else {
            fprintf(stderr, "usage: ref_server [--listen HOST:PORT]\n");
            return 2;
        }
    }
    // the signals are taken by sigwait below, in this thread; gRPC's threads inherit the mask
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

    HealthService health_service;
    DecoderService decoder_service;
    int port = 0;
    grpc::ServerBuilder b;
    b.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
    b.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    b.RegisterService(&health_service);
    b.RegisterService(&decoder_service);
    std::unique_ptr<grpc::Server> server = b.BuildAndStart();
    if (!server || port <= 0) {
        fprintf(stderr, "ref_server: cannot listen on %s\n", listen.c_str());
        return 1;
    }
    printf("{\"port\":%d}\n", port);
    fflush(stdout);
    fprintf(stderr, "ref_server: listening on port %d (grpc++ %s)\n", port, grpc::Version().c_str());

    int sig = 0;
    sigwait(&sigs, &sig);
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server->Wait();
    return 0;
}
