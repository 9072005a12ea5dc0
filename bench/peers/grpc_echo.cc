/*
 * The gRPC C++ peer of bench_rpc (Debian's libgrpc++): a synchronous server whose Echo sends
 * the payload back, and a client calling it from N threads over one channel, with the same
 * load generator (bench/common/load.c) as the devcoord and bare-nng clients.
 *
 *   grpc_echo serve URL
 *   grpc_echo client URL THREADS PAYLOAD_BYTES SECONDS WARMUP_SECONDS
 *
 * URL is tcp://HOST:PORT like the others'; gRPC gets HOST:PORT.
 */
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include <pthread.h>
#include <signal.h>

#include <grpcpp/grpcpp.h>

#include "echo.grpc.pb.h"

#include "bench.h"
#include "load.h"

namespace
{

const char usage[] = "usage: grpc_echo serve URL\n"
                     "       grpc_echo client URL THREADS PAYLOAD SECONDS WARMUP\n";

std::string
target_of(const char *url)
{
    const char *prefix = "tcp://";
    if (std::strncmp(url, prefix, std::strlen(prefix)) == 0) {
        return std::string(url + std::strlen(prefix));
    }
    return std::string(url);
}

class EchoService final : public devcoord::bench::Echo::Service
{
    grpc::Status Echo(grpc::ServerContext *, const devcoord::bench::EchoMessage *in,
                      devcoord::bench::EchoMessage *out) override
    {
        out->set_payload(in->payload());
        return grpc::Status::OK;
    }
};

int
serve(const char *url)
{
    EchoService service;
    grpc::ServerBuilder builder;
    sigset_t set;
    int sig;

    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    builder.AddListeningPort(target_of(url), grpc::InsecureServerCredentials());
    builder.RegisterService(&service);
    builder.SetMaxReceiveMessageSize(64 << 20);
    std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
    if (!server) {
        std::fprintf(stderr, "grpc_echo: cannot listen on %s\n", url);
        return 1;
    }
    sigwait(&set, &sig);
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    return 0;
}

struct Client {
    std::unique_ptr<devcoord::bench::Echo::Stub> stub;
    devcoord::bench::EchoMessage request;
    size_t len;
};

void *
thread_init(void *arg, unsigned)
{
    return arg;
}

int
call(void *state)
{
    auto *c = static_cast<Client *>(state);
    grpc::ClientContext ctx;
    devcoord::bench::EchoMessage reply;

    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::Status s = c->stub->Echo(&ctx, c->request, &reply);
    return s.ok() && reply.payload().size() == c->len ? 0 : -1;
}

int
client(char **argv)
{
    struct load_opts lo = {};
    struct load_result r;
    uint64_t threads, len;

    if (bench_parse_u64(argv[1], 1, 4096, "THREADS", &threads) != 0 ||
        bench_parse_u64(argv[2], 0, 1u << 30, "PAYLOAD", &len) != 0 ||
        bench_parse_double(argv[3], "SECONDS", &lo.duration_s) != 0 ||
        bench_parse_double(argv[4], "WARMUP", &lo.warmup_s) != 0) {
        return 2;
    }
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    auto channel =
        grpc::CreateCustomChannel(target_of(argv[0]), grpc::InsecureChannelCredentials(), args);
    if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(5))) {
        std::fprintf(stderr, "grpc_echo: cannot reach %s\n", argv[0]);
        return 1;
    }
    Client c;
    c.stub = devcoord::bench::Echo::NewStub(channel);
    c.request.set_payload(std::string(len, '\xa5'));
    c.len          = len;
    lo.threads     = static_cast<unsigned>(threads);
    lo.thread_init = thread_init;
    lo.call        = call;
    lo.arg         = &c;
    int rv         = load_run(&lo, &r);
    load_print(stdout, &r);
    return rv == 0 ? 0 : 1;
}

} // namespace

int
main(int argc, char **argv)
{
    if (argc == 3 && std::strcmp(argv[1], "serve") == 0) {
        return serve(argv[2]);
    }
    if (argc == 7 && std::strcmp(argv[1], "client") == 0) {
        return client(argv + 2);
    }
    std::fprintf(stderr, "%s", usage);
    return 2;
}
