// callbench: a gRPC load generator for the kdecode benchmark (grpc++ synchronous stubs, one
// thread per caller). Prints one JSON object on stdout per run.
//
//   callbench --target H:P --mode load --method health|generate [--concurrency N]
//             [--duration S] [--warmup S] [--max-tokens M] [--prompt 1,17,42,99] [--no-spec]
//             [--channels K] [--label NAME]
//       N callers issue calls back to back for warmup + duration seconds; the calls that start
//       and end within the measured window count: calls/s, p50/p90/p99/mean/max latency (µs).
//   callbench --target H:P --mode stream [--max-tokens M] [--reps K] [--prompt ...] [--no-spec]
//       One caller alternates Generate(max_tokens=1) and Generate(max_tokens=M) K times
//       (ignore_eos, so every call streams exactly its max_tokens); per-token streaming cost =
//       (median latency(M) - median latency(1)) / (M - 1). With --metrics H:P (kdecode's
//       Prometheus endpoint) it also reads kdecode_step_duration_seconds_sum around each call
//       and splits that cost into the engine steps and the rest (gRPC, streaming, hand-offs
//       between threads): medians over the calls of (latency - step time), per token.
//   callbench --target H:P --mode ready [--timeout S]
//       Waits until Health.Check("kdecode.v1.Decoder") answers SERVING (exit 1 on timeout).
//
// Generate calls count as errors unless they end OK with exactly max_tokens tokens and a
// final finish_reason LENGTH (or STOP). Errors are reported, never silently dropped.
#include <grpcpp/grpcpp.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "grpc/health/v1/health.grpc.pb.h"
#include "kdecode/v1/decoder.grpc.pb.h"

namespace {

namespace health = grpc::health::v1;
namespace kd = kdecode::v1;
using Clock = std::chrono::steady_clock;

struct Opts {
    std::string target, mode = "load", method = "health", label, prompt = "1,17,42,99", metrics;
    int concurrency = 1, max_tokens = 1, reps = 10, channels = 1;
    double duration = 5, warmup = 1, timeout = 60;
    bool no_spec = false;
};

double since(Clock::time_point t0, Clock::time_point t) {
    return std::chrono::duration<double>(t - t0).count();
}

struct CallResult {
    bool ok = false;
    int messages = 0, tokens = 0;
    std::string error;
};

class Caller {
  public:
    Caller(const std::shared_ptr<grpc::Channel> &ch, const Opts &o)
        : health_(health::Health::NewStub(ch)), decoder_(kd::Decoder::NewStub(ch)), o_(o) {
        std::stringstream ss(o.prompt);
        std::string tok;
        while (std::getline(ss, tok, ',')) req_.add_prompt_token_ids(std::atoi(tok.c_str()));
        req_.set_ignore_eos(true);
        if (o.no_spec) req_.mutable_speculation()->set_source(kd::DRAFT_SOURCE_NONE);
    }

    CallResult Health(const std::string &service, health::HealthCheckResponse::ServingStatus *st) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
        health::HealthCheckRequest q;
        q.set_service(service);
        health::HealthCheckResponse r;
        grpc::Status s = health_->Check(&ctx, q, &r);
        CallResult c;
        c.ok = s.ok();
        if (!c.ok) c.error = StatusName(s);
        if (st) *st = r.status();
        return c;
    }

    CallResult Generate(int max_tokens) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
        req_.set_max_tokens(max_tokens);
        std::unique_ptr<grpc::ClientReader<kd::GenerateResponse>> rd(decoder_->Generate(&ctx, req_));
        kd::GenerateResponse r;
        CallResult c;
        kd::FinishReason fin = kd::FINISH_REASON_UNSPECIFIED;
        while (rd->Read(&r)) {
            c.messages++;
            c.tokens += r.token_ids_size();
            fin = r.finish_reason();
        }
        grpc::Status s = rd->Finish();
        if (!s.ok()) {
            c.error = StatusName(s);
        } else if (c.tokens != max_tokens ||
                   (fin != kd::FINISH_REASON_LENGTH && fin != kd::FINISH_REASON_STOP)) {
            c.error = "SHORT_STREAM";
        } else {
            c.ok = true;
        }
        return c;
    }

    CallResult Call() {
        return o_.method == "generate" ? Generate(o_.max_tokens) : Health("", nullptr);
    }

  private:
    static std::string StatusName(const grpc::Status &s) {
        static const char *names[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
                                      "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
                                      "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
                                      "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
        int c = s.error_code();
        return c >= 0 && c <= 16 ? names[c] : "CODE_" + std::to_string(c);
    }
    std::unique_ptr<health::Health::Stub> health_;
    std::unique_ptr<kd::Decoder::Stub> decoder_;
    const Opts &o_;
    kd::GenerateRequest req_;
};

std::vector<std::shared_ptr<grpc::Channel>> make_channels(const Opts &o) {
    std::vector<std::shared_ptr<grpc::Channel>> v;
    for (int i = 0; i < o.channels; i++) {
        grpc::ChannelArguments args;
        args.SetInt("kdbench.channel", i); // distinct args: a connection per channel
        v.push_back(grpc::CreateCustomChannel(o.target, grpc::InsecureChannelCredentials(), args));
    }
    for (auto &ch : v)
        if (!ch->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
            fprintf(stderr, "callbench: cannot connect to %s\n", o.target.c_str());
            exit(1);
        }
    return v;
}

double pct(const std::vector<double> &sorted, double p) {
    if (sorted.empty()) return 0;
    size_t i = (size_t)(p / 100.0 * (double)(sorted.size() - 1) + 0.5);
    return sorted[std::min(i, sorted.size() - 1)];
}

std::string json_errors(const std::map<std::string, long> &errs) {
    std::string s = "{";
    for (auto &e : errs) s += (s.size() > 1 ? "," : "") + ("\"" + e.first + "\":" + std::to_string(e.second));
    return s + "}";
}

int run_load(const Opts &o) {
    auto chans = make_channels(o);
    const Clock::time_point t0 = Clock::now();
    const Clock::time_point t_meas = t0 + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(o.warmup));
    const Clock::time_point t_end = t_meas + std::chrono::duration_cast<Clock::duration>(
                                                 std::chrono::duration<double>(o.duration));
    std::mutex mu;
    std::vector<double> lat;
    std::map<std::string, long> errors;
    long messages = 0, tokens = 0;
    std::vector<std::thread> th;
    for (int i = 0; i < o.concurrency; i++) {
        th.emplace_back([&, i] {
            Caller c(chans[(size_t)i % chans.size()], o);
            std::vector<double> mine;
            std::map<std::string, long> my_err;
            long my_msg = 0, my_tok = 0;
            for (;;) {
                const Clock::time_point a = Clock::now();
                if (a >= t_end) break;
                CallResult r = c.Call();
                const Clock::time_point b = Clock::now();
                if (a < t_meas || b > t_end) continue; // outside the measured window
                if (!r.ok) {
                    my_err[r.error]++;
                    continue;
                }
                mine.push_back(since(a, b) * 1e6);
                my_msg += r.messages, my_tok += r.tokens;
            }
            std::lock_guard<std::mutex> g(mu);
            lat.insert(lat.end(), mine.begin(), mine.end());
            for (auto &e : my_err) errors[e.first] += e.second;
            messages += my_msg, tokens += my_tok;
        });
    }
    for (auto &t : th) t.join();
    std::sort(lat.begin(), lat.end());
    double sum = 0;
    for (double x : lat) sum += x;
    const double n = (double)lat.size();
    printf("{\"label\":\"%s\",\"mode\":\"load\",\"method\":\"%s\",\"max_tokens\":%d,\"concurrency\":%d,"
           "\"channels\":%d,\"seconds\":%.3f,\"calls\":%zu,\"calls_per_s\":%.1f,\"p50_us\":%.1f,"
           "\"p90_us\":%.1f,\"p99_us\":%.1f,\"mean_us\":%.1f,\"max_us\":%.1f,\"messages_per_call\":%.3f,"
           "\"tokens_per_call\":%.3f,\"errors\":%s}\n",
           o.label.c_str(), o.method.c_str(), o.method == "generate" ? o.max_tokens : 0, o.concurrency,
           o.channels, o.duration, lat.size(), n / o.duration, pct(lat, 50), pct(lat, 90), pct(lat, 99),
           n ? sum / n : 0, lat.empty() ? 0 : lat.back(), n ? (double)messages / n : 0,
           n ? (double)tokens / n : 0, json_errors(errors).c_str());
    return 0;
}

// kdecode_step_duration_seconds_sum from a Prometheus endpoint (plain HTTP/1.0 GET), or -1.
double scrape_step_seconds(const std::string &hostport) {
    const size_t colon = hostport.rfind(':');
    if (colon == std::string::npos) return -1;
    const std::string host = hostport.substr(0, colon), port = hostport.substr(colon + 1);
    addrinfo hints{}, *ai = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host.c_str(), port.c_str(), &hints, &ai) != 0 || !ai) return -1;
    int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        if (fd >= 0) close(fd);
        freeaddrinfo(ai);
        return -1;
    }
    freeaddrinfo(ai);
    const std::string req = "GET /metrics HTTP/1.0\r\nHost: " + hostport + "\r\n\r\n";
    if (write(fd, req.data(), req.size()) != (ssize_t)req.size()) {
        close(fd);
        return -1;
    }
    std::string body;
    char buf[65536];
    for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) body.append(buf, (size_t)n);
    close(fd);
    const std::string key = "\nkdecode_step_duration_seconds_sum ";
    const size_t at = body.find(key);
    return at == std::string::npos ? -1 : std::strtod(body.c_str() + at + key.size(), nullptr);
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return pct(v, 50);
}

int run_stream(const Opts &o) {
    auto chans = make_channels(o);
    Caller c(chans[0], o);
    const bool metrics = !o.metrics.empty();
    if (metrics && scrape_step_seconds(o.metrics) < 0) {
        fprintf(stderr, "callbench: no kdecode_step_duration_seconds at http://%s/metrics\n", o.metrics.c_str());
        return 1;
    }
    std::vector<double> t1, tm, rest1, restm; // latency; latency minus engine-step time (µs)
    std::map<std::string, long> errors;
    long msgs = 0;
    for (int i = 0; i < 2; i++) c.Generate(o.max_tokens); // warm up
    for (int i = 0; i < o.reps; i++) {
        for (int m : {1, o.max_tokens}) {
            const double s0 = metrics ? scrape_step_seconds(o.metrics) : 0;
            const Clock::time_point a = Clock::now();
            CallResult r = c.Generate(m);
            const double us = since(a, Clock::now()) * 1e6;
            if (!r.ok) {
                errors[r.error]++;
                continue;
            }
            (m == 1 ? t1 : tm).push_back(us);
            if (m != 1) msgs += r.messages;
            if (metrics) {
                // the engine thread records a step just after its events went out: let it
                std::this_thread::sleep_for(std::chrono::milliseconds(5));
                const double step_us = (scrape_step_seconds(o.metrics) - s0) * 1e6;
                (m == 1 ? rest1 : restm).push_back(us - step_us);
            }
        }
    }
    const double m1 = median(t1), mm = median(tm), den = o.max_tokens - 1;
    std::string split = "";
    if (metrics && !rest1.empty() && !restm.empty()) {
        const double r1 = median(rest1), rm = median(restm);
        char b[256];
        snprintf(b, sizeof b, ",\"step_per_token_us\":%.2f,\"rest_per_token_us\":%.2f,\"rest_us_1\":%.1f",
                 (mm - m1) / den - (rm - r1) / den, (rm - r1) / den, r1);
        split = b;
    }
    printf("{\"label\":\"%s\",\"mode\":\"stream\",\"max_tokens\":%d,\"reps\":%d,\"median_us_1\":%.1f,"
           "\"median_us_m\":%.1f,\"per_token_us\":%.2f,\"messages_per_call_m\":%.2f%s,\"errors\":%s}\n",
           o.label.c_str(), o.max_tokens, o.reps, m1, mm, (mm - m1) / den,
           tm.empty() ? 0 : (double)msgs / (double)tm.size(), split.c_str(), json_errors(errors).c_str());
    return errors.empty() ? 0 : 1;
}

int run_ready(const Opts &o) {
    const Clock::time_point t0 = Clock::now();
    auto ch = grpc::CreateChannel(o.target, grpc::InsecureChannelCredentials());
    Caller c(ch, o);
    while (since(t0, Clock::now()) < o.timeout) {
        health::HealthCheckResponse::ServingStatus st = health::HealthCheckResponse::UNKNOWN;
        if (c.Health("kdecode.v1.Decoder", &st).ok && st == health::HealthCheckResponse::SERVING) {
            fprintf(stderr, "callbench: %s ready after %.2f s\n", o.target.c_str(), since(t0, Clock::now()));
            return 0;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    fprintf(stderr, "callbench: %s not ready after %.0f s\n", o.target.c_str(), o.timeout);
    return 1;
}

void usage() {
    fprintf(stderr, "usage: callbench --target HOST:PORT [--mode load|stream|ready] [--method health|generate]\n"
                    "  [--concurrency N] [--duration S] [--warmup S] [--max-tokens M] [--reps K]\n"
                    "  [--prompt IDS] [--no-spec] [--channels K] [--timeout S] [--label NAME]\n"
                    "  [--metrics HOST:PORT]  (stream mode: kdecode's /metrics, to split off step time)\n");
}

} // namespace

int main(int argc, char **argv) {
    Opts o;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto val = [&]() -> const char * {
            if (i + 1 >= argc) {
                usage();
                exit(2);
            }
            return argv[++i];
        };
        if (a == "--target") o.target = val();
        else if (a == "--mode") o.mode = val();
        else if (a == "--method") o.method = val();
        else if (a == "--label") o.label = val();
        else if (a == "--prompt") o.prompt = val();
        else if (a == "--metrics") o.metrics = val();
        else if (a == "--concurrency") o.concurrency = std::atoi(val());
        else if (a == "--max-tokens") o.max_tokens = std::atoi(val());
        else if (a == "--reps") o.reps = std::atoi(val());
        else if (a == "--channels") o.channels = std::atoi(val());
        else if (a == "--duration") o.duration = std::atof(val());
        else if (a == "--warmup") o.warmup = std::atof(val());
        else if (a == "--timeout") o.timeout = std::atof(val());
        else if (a == "--no-spec") o.no_spec = true;
        else {
            usage();
            return 2;
        }
    }
    if (o.target.empty() || o.concurrency < 1 || o.channels < 1 || o.max_tokens < 1 || o.duration <= 0 ||
        (o.method != "health" && o.method != "generate") || (o.mode == "stream" && o.max_tokens < 2)) {
        usage();
        return 2;
    }
    if (o.mode == "load") return run_load(o);
    if (o.mode == "stream") return run_stream(o);
    if (o.mode == "ready") return run_ready(o);
    usage();
    return 2;
}
