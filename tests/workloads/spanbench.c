// Benchmark workload for `cargo xtask bench`: the cost of one span, a pair of USDT probes
// (bench:start with an integer argument, bench:end) around nothing. `spanbench N` prints
// ns_per_span.
#include <stdio.h>
#include <stdlib.h>
#include <sys/sdt.h>
#include <time.h>

int main(int argc, char **argv) {
    long spans = argc > 1 ? atol(argv[1]) : 100000;
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (long i = 0; i < spans; i++) {
        STAP_PROBE1(bench, start, i & 7);
        STAP_PROBE(bench, end);
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    double ns = (end.tv_sec - start.tv_sec) * 1e9 + (end.tv_nsec - start.tv_nsec);
    printf("ns_per_span=%.1f\n", ns / spans);
    return 0;
}
