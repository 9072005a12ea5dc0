/*
 * iperf3 loopback TCP throughput, the limit the data-moving benches compare with: one stream,
 * or one each way at once (--bidir, as a 2-rank ring or the data link's exchange sends).
 */
#ifndef DEVCOORD_BENCH_IPERF_H
#define DEVCOORD_BENCH_IPERF_H

/* Bytes/s for `seconds` (at least 1), per direction with bidir (the mean of the two), or NAN
 * when iperf3 was not found at configure time or failed. */
double bench_iperf(double seconds, int bidir);

#endif
