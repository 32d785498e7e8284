// The demo `cargo xtask run` traces with `topdown stat -u`: three functions, each dominated by a
// different bottleneck, so TopDown tells them apart on a machine with a PMU.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CHASE_ENTRIES (16u << 20) // 16 Mi entries x 8 bytes: far beyond the caches

static size_t *chase_next;

// Not probed: builds one random cycle through the array (Sattolo's algorithm), so every load
// depends on the previous one and lands on an unpredictable cache line.
static void setup_chase(void) {
    chase_next = malloc(CHASE_ENTRIES * sizeof *chase_next);
    if (!chase_next) exit(1);
    for (size_t i = 0; i < CHASE_ENTRIES; i++) chase_next[i] = i;
    uint64_t state = 88172645463325252ull;
    for (size_t i = CHASE_ENTRIES - 1; i > 0; i--) {
        state ^= state << 13, state ^= state >> 7, state ^= state << 17;
        size_t j = state % i;
        size_t t = chase_next[i];
        chase_next[i] = chase_next[j];
        chase_next[j] = t;
    }
}

// Memory bound: dependent loads that miss every cache level.
__attribute__((noinline)) size_t pointer_chase(size_t steps) {
    size_t at = 0;
    for (size_t i = 0; i < steps; i++) at = chase_next[at];
    return at;
}

// Bad speculation: a branch on random bits mispredicts about half the time.
__attribute__((noinline)) long unpredictable_branches(long n) {
    uint64_t state = 0x9E3779B97F4A7C15ull;
    long sum = 0;
    for (long i = 0; i < n; i++) {
        state ^= state << 13, state ^= state >> 7, state ^= state << 17;
        if (state & 1) sum += (long)(state >> 32);
        else sum -= (long)(state >> 40);
    }
    return sum;
}

// Core bound / retiring: one long chain of dependent floating-point operations.
__attribute__((noinline)) double dependent_arithmetic(long n) {
    double x = 1.0;
    for (long i = 0; i < n; i++) x = x * 1.0000001 + 0.25;
    return x;
}

int main(void) {
    setup_chase();
    size_t at = pointer_chase(6u << 20);
    long sum = unpredictable_branches(60l << 20);
    double x = dependent_arithmetic(60l << 20);
    printf("demo done (%zu %ld %.3g)\n", at, sum, x);
    return 0;
}
