/* iperf3 on loopback, the TCP limit the benches compare with (see iperf.h). */
#include "iperf.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"

#ifdef BENCH_IPERF3
/* bits_per_second of the JSON object `key` (with its quotes) of iperf3's -J text, or NAN. */
static double
iperf_bps(const char *text, const char *key)
{
    const char *at = strstr(text, key);
    char *end;
    double bps;

    if (at == NULL || (at = strstr(at, "\"bits_per_second\":")) == NULL) {
        return NAN;
    }
    at += strlen("\"bits_per_second\":");
    errno = 0;
    bps   = strtod(at, &end);
    return errno != 0 || end == at ? NAN : bps;
}
#endif

/* iperf3 loopback TCP throughput in bytes/s, or NAN: one stream, or with `bidir` one
 * stream each way at once (iperf3 --bidir), reported per direction (the mean of the two). */
double
bench_iperf(double seconds, int bidir)
{
#ifdef BENCH_IPERF3
    char port[16], dur[16], out[1024], slog[1024];
    char *sargv[8], *cargv[12], *text;
    double bps = NAN;
    pid_t server, client;
    int p = bench_free_port();

    snprintf(port, sizeof(port), "%d", p);
    snprintf(dur, sizeof(dur), "%.0f", seconds < 1 ? 1 : seconds);
    snprintf(out, sizeof(out), "%s/iperf3.json", bench_tmpdir());
    snprintf(slog, sizeof(slog), "%s/iperf3-server.log", bench_tmpdir());
    sargv[0] = BENCH_IPERF3;
    sargv[1] = "-s";
    sargv[2] = "-1";
    sargv[3] = "-B";
    sargv[4] = "127.0.0.1";
    sargv[5] = "-p";
    sargv[6] = port;
    sargv[7] = NULL;
    if ((server = bench_spawn(sargv, slog)) < 0) {
        return NAN;
    }
    bench_sleep_ms(300);
    cargv[0] = BENCH_IPERF3;
    cargv[1] = "-c";
    cargv[2] = "127.0.0.1";
    cargv[3] = "-p";
    cargv[4] = port;
    cargv[5] = "-t";
    cargv[6] = dur;
    cargv[7] = "-J";
    cargv[8] = bidir ? "--bidir" : NULL;
    cargv[9] = NULL;
    unlink(out);
    if ((client = bench_spawn(cargv, out)) < 0) {
        bench_stop(server, 1000);
        return NAN;
    }
    if (bench_wait(client, 60000) != 0) {
        bench_kill(client);
    }
    bench_stop(server, 1000);
    if ((text = bench_read_file(out, NULL)) == NULL) {
        return NAN;
    }
    bps = iperf_bps(text, "\"sum_received\"");
    if (bidir) {
        bps = (bps + iperf_bps(text, "\"sum_received_bidir_reverse\"")) / 2;
    }
    free(text);
    return bps / 8;
#else
    (void)seconds;
    (void)bidir;
    fprintf(stderr, "bench: iperf3 not found at configure time: no loopback limit\n");
    return NAN;
#endif
}
