// Benchmark workload for `cargo xtask bench`: the cost of one call of a tiny function, probed
// or not. `callbench N` prints ns_per_call. Also holds 1000 tiny functions f0000..f0999 so
// attaching 1, 100 and 1000 probes can be timed (globs f0000, f00??, f0???). Build with
// -fno-ipa-icf so identical bodies are not merged into one symbol.
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__attribute__((noinline)) int tiny(int x) { return x + 1; }

#define F(n) __attribute__((noinline)) int f##n(int x) { return x + 1; }
#define F10(n) F(n##0) F(n##1) F(n##2) F(n##3) F(n##4) F(n##5) F(n##6) F(n##7) F(n##8) F(n##9)
#define F100(n) F10(n##0) F10(n##1) F10(n##2) F10(n##3) F10(n##4) F10(n##5) F10(n##6) F10(n##7) F10(n##8) F10(n##9)
F100(00) F100(01) F100(02) F100(03) F100(04) F100(05) F100(06) F100(07) F100(08) F100(09)
#undef F

int main(int argc, char **argv) {
    long calls = argc > 1 ? atol(argv[1]) : 1000000;
    volatile int sink = 0;
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (long i = 0; i < calls; i++) sink = tiny(sink);
    clock_gettime(CLOCK_MONOTONIC, &end);
    double ns = (end.tv_sec - start.tv_sec) * 1e9 + (end.tv_nsec - start.tv_nsec);
    printf("ns_per_call=%.1f\n", ns / calls);
    return 0;
}
