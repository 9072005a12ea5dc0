/*
 * The workers' data link alone (issue 17, common/datalink.c): two data ports in this
 * process, each dialing the other, send a part of 1 MiB or 16 MiB both ways at once (as two
 * workers of a group exchange their parts), over tcp:// and tls+tcp://. The figure is bytes per
 * second per direction, from the start of both sends until both parts have landed in their
 * receivers' buffers, median of the repeats; beside it iperf3 --bidir on loopback, the TCP
 * limit for two streams at once on this machine. TLS uses a throwaway CA and certificate made
 * with the openssl command (its row is skipped when that fails).
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "bench.h"
#include "datalink.h"
#include "dltls.h"
#include "iperf.h"

#define MAX_REPS 40

static const char usage[] = "usage: bench_datalink [--quick] [--out DIR] [--build DIR]\n";

/* One receiving side: where parts land and how many bytes did. */
struct side {
    pthread_mutex_t mtx;
    pthread_cond_t cv;
    uint8_t *dst;
    size_t bytes, received;
};

static void
side_begin(void *arg, const char *peer, const struct dlink_hdr *h, uint8_t **dst, void **pin,
           uint32_t *wait_ms)
{
    struct side *s = arg;

    (void)peer;
    (void)wait_ms; /* the link's own bound */
    *dst = s->dst + h->offset;
    *pin = s;
}

static void
side_end(void *arg, const char *peer, const struct dlink_hdr *h, void *pin, bool ok)
{
    struct side *s = arg;

    (void)peer;
    (void)pin;
    pthread_mutex_lock(&s->mtx);
    if (ok) {
        s->received += h->length;
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mtx);
}

static void
side_lost(void *arg, const char *peer, const dc_status *why)
{
    (void)arg;
    (void)peer;
    (void)why;
}

struct sender {
    struct dlink_out *out;
    const uint8_t *src;
    size_t bytes;
    pthread_barrier_t *go;
    int rv;
};

static void *
sender_main(void *arg)
{
    struct sender *s   = arg;
    struct dlink_hdr h = { .kind = DLINK_DATA, .total = s->bytes };
    dc_status st;

    pthread_barrier_wait(s->go);
    s->rv = dlink_send(s->out, &h, s->src, s->bytes, &st) == DC_OK ? 0 : -1;
    if (s->rv != 0) {
        fprintf(stderr, "bench_datalink: send: %s\n", st.message);
    }
    return NULL;
}

/* Median seconds of `reps` exchanges of `bytes` each way, or -1. */
static double
exchange(struct dlink_out *ab, struct dlink_out *ba, struct side *a, struct side *b,
         const uint8_t *src, size_t bytes, unsigned reps)
{
    double times[MAX_REPS];
    unsigned done = 0;

    for (unsigned r = 0; r < reps; r++) {
        pthread_barrier_t go;
        pthread_t t1, t2;
        struct sender s1 = { ab, src, bytes, &go, 0 }, s2 = { ba, src, bytes, &go, 0 };
        uint64_t t0;

        a->bytes = b->bytes = bytes;
        a->received = b->received = 0;
        pthread_barrier_init(&go, NULL, 3);
        pthread_create(&t1, NULL, sender_main, &s1);
        pthread_create(&t2, NULL, sender_main, &s2);
        pthread_barrier_wait(&go);
        t0 = bench_now_ns();
        for (struct side *s = a; s != NULL; s = s == a ? b : NULL) {
            pthread_mutex_lock(&s->mtx);
            while (s->received < bytes) {
                pthread_cond_wait(&s->cv, &s->mtx);
            }
            pthread_mutex_unlock(&s->mtx);
        }
        times[done++] = (double)(bench_now_ns() - t0) / 1e9;
        pthread_join(t1, NULL);
        pthread_join(t2, NULL);
        pthread_barrier_destroy(&go);
        if (s1.rv != 0 || s2.rv != 0) {
            return -1;
        }
        if (memcmp(a->dst, src, bytes) != 0 || memcmp(b->dst, src, bytes) != 0) {
            fprintf(stderr, "bench_datalink: a part arrived changed\n");
            return -1;
        }
    }
    return bench_percentile(times, done, 50);
}

/* A throwaway CA and a server certificate for 127.0.0.1 signed by it, in the temporary
 * directory (mbedTLS 2.28 does not match IP subjectAltNames: the name is a DNS one, as the
 * integration tests' PKI does); 0 or -1. */
static int
make_cert(char *ca, char *cert, char *key, size_t cap)
{
    const char *d = bench_tmpdir();
    char cmd[4096];

    snprintf(ca, cap, "%s/datalink-ca.pem", d);
    snprintf(cert, cap, "%s/datalink-cert.pem", d);
    snprintf(key, cap, "%s/datalink-key.pem", d);
    snprintf(cmd, sizeof(cmd),
             "cd '%s' && printf 'subjectAltName=DNS:127.0.0.1\\n' > datalink-ext.cnf && "
             "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
             "-keyout datalink-ca.key -out datalink-ca.pem -days 1 -subj /CN=bench-ca "
             "-addext basicConstraints=critical,CA:TRUE && "
             "openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
             "-keyout datalink-key.pem -out datalink.csr -subj /CN=127.0.0.1 && "
             "openssl x509 -req -in datalink.csr -CA datalink-ca.pem -CAkey datalink-ca.key "
             "-CAcreateserial -out datalink-cert.pem -days 1 -extfile datalink-ext.cnf",
             d);
    return system(cmd) == 0 ? 0 : -1;
}

/* Both directions' throughput (bytes/s per direction) for each size, into gbs; 0 or -1. */
static int
run_scheme(bool tls, const uint64_t *sizes, size_t n_sizes, unsigned reps, double *gbs)
{
    struct side a = { .bytes = 0 }, b = { .bytes = 0 };
    struct dlink_events ea = {
        .arg = &a, .frame_begin = side_begin, .frame_end = side_end, .peer_lost = side_lost
    };
    struct dlink_events eb = {
        .arg = &b, .frame_begin = side_begin, .frame_end = side_end, .peer_lost = side_lost
    };
    struct dlink_server *sa = NULL, *sb = NULL;
    struct dlink_out *ab = NULL, *ba = NULL;
    struct dltls *server = NULL, *client = NULL;
    size_t max   = sizes[n_sizes - 1];
    uint8_t *src = malloc(max);
    char ca[512], cert[512], key[512], url[64];
    const char *scheme = tls ? "tls+tcp" : "tcp";
    dc_status st;
    int rv = -1;

    pthread_mutex_init(&a.mtx, NULL);
    pthread_mutex_init(&b.mtx, NULL);
    pthread_cond_init(&a.cv, NULL);
    pthread_cond_init(&b.cv, NULL);
    a.dst = malloc(max);
    b.dst = malloc(max);
    if (src == NULL || a.dst == NULL || b.dst == NULL) {
        goto out;
    }
    for (size_t i = 0; i < max; i++) {
        src[i] = (uint8_t)(i * 13 + 5);
    }
    if (tls) {
        struct config_tls t = { 0 };
        if (make_cert(ca, cert, key, sizeof(cert)) != 0) {
            fprintf(stderr, "bench_datalink: openssl could not make a certificate: no TLS row\n");
            goto out;
        }
        t.cert = cert;
        t.key  = key;
        if (auth_dltls_server(&t, &server, &st) != DC_OK ||
            auth_dltls_client(ca, NULL, NULL, "127.0.0.1", &client, &st) != DC_OK) {
            fprintf(stderr, "bench_datalink: TLS: %s\n", st.message);
            goto out;
        }
    }
    snprintf(url, sizeof(url), "%s://127.0.0.1:0", scheme);
    if (dlink_server_start(url, server, max, 10000, &ea, &sa, &st) != DC_OK ||
        dlink_server_start(url, server, max, 10000, &eb, &sb, &st) != DC_OK) {
        fprintf(stderr, "bench_datalink: %s\n", st.message);
        goto out;
    }
    snprintf(url, sizeof(url), "%s://127.0.0.1:%d", scheme, dlink_server_port(sb));
    if (dlink_dial(url, client, dlink_server_secret(sb), "a", 5000, &ab, &st) != DC_OK) {
        fprintf(stderr, "bench_datalink: %s\n", st.message);
        goto out;
    }
    snprintf(url, sizeof(url), "%s://127.0.0.1:%d", scheme, dlink_server_port(sa));
    if (dlink_dial(url, client, dlink_server_secret(sa), "b", 5000, &ba, &st) != DC_OK) {
        fprintf(stderr, "bench_datalink: %s\n", st.message);
        goto out;
    }
    /* Warm up both connections (TLS sessions, TCP windows). */
    if (exchange(ab, ba, &b, &a, src, max, 1) < 0) {
        goto out;
    }
    for (size_t i = 0; i < n_sizes; i++) {
        double s = exchange(ab, ba, &b, &a, src, sizes[i], reps);
        if (s < 0) {
            goto out;
        }
        gbs[i] = (double)sizes[i] / s;
    }
    rv = 0;
out:
    dlink_out_close(ab);
    dlink_out_close(ba);
    dlink_server_free(sa);
    dlink_server_free(sb);
    dltls_free(server);
    dltls_free(client);
    free(src);
    free(a.dst);
    free(b.dst);
    return rv;
}

int
main(int argc, char **argv)
{
    static const uint64_t sizes[] = { 1u << 20, 16u << 20 };
    enum { N = sizeof(sizes) / sizeof(sizes[0]) };
    double plain[N] = { 0 }, tls[N] = { 0 }, bidir;
    struct bench_summary sum;
    struct bench_args a;
    bool have_tls;
    unsigned reps;
    FILE *f;
    int rv;

    bench_init();
    if ((rv = bench_parse_args(argc, argv, &a, usage, NULL, NULL)) != 0) {
        return rv;
    }
    reps = a.quick ? 5 : 20;
    if (run_scheme(false, sizes, N, reps, plain) != 0) {
        fprintf(stderr, "bench_datalink: the plain data link failed\n");
        return 1;
    }
    have_tls = run_scheme(true, sizes, N, reps, tls) == 0;
    bidir    = bench_iperf(a.quick ? 1 : 3, 1);
    printf("\nData link, a part sent both ways at once between two data ports of one process; "
           "GB/s per direction, median of %u\n",
           reps);
    printf("%-8s %12s %12s %18s\n", "size", "tcp", "tls+tcp", "iperf3 --bidir");
    for (size_t i = 0; i < N; i++) {
        printf("%-8s %12.2f %12s %18s\n", bench_size_text(sizes[i]), plain[i] / 1e9,
               have_tls ? bench_fmt("%.2f", tls[i] / 1e9) : "-",
               isnan(bidir) ? "-" : bench_fmt("%.2f", bidir / 1e9));
    }
    if ((f = bench_result_open(&a, "datalink.json")) != NULL) {
        fprintf(f,
                "{\"bench\": \"datalink\", \"reps\": %u, \"iperf3_bidir_Bps\": %.0f, \"rows\": [",
                reps, isnan(bidir) ? 0.0 : bidir);
        for (size_t i = 0; i < N; i++) {
            fprintf(f, "%s\n  {\"bytes\": %llu, \"tcp_Bps\": %.0f, \"tls_Bps\": %.0f}",
                    i ? "," : "", (unsigned long long)sizes[i], plain[i], have_tls ? tls[i] : 0.0);
        }
        fprintf(f, "\n]}\n");
        fclose(f);
    }
    if (bench_summary_open(&sum, &a, "datalink") == 0) {
        bench_summary_row(&sum, "data link 16 MiB both ways, per direction (tcp)",
                          bench_fmt("%.2f GB/s", plain[N - 1] / 1e9),
                          isnan(bidir) ? "-" : bench_fmt("iperf3 --bidir %.2f GB/s", bidir / 1e9),
                          isnan(bidir) ? NAN : plain[N - 1] / bidir, "-", -1);
        if (have_tls) {
            bench_summary_row(&sum, "data link 16 MiB both ways, per direction (tls+tcp)",
                              bench_fmt("%.2f GB/s", tls[N - 1] / 1e9),
                              bench_fmt("tcp %.2f GB/s", plain[N - 1] / 1e9),
                              tls[N - 1] / plain[N - 1], "-", -1);
        }
        bench_summary_close(&sum);
    }
    return 0;
}
