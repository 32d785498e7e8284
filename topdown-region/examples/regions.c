/*
 * Two regions with different bottlenecks, measured by the program itself:
 *   "pointer_chase" walks a random cycle through 32 MiB (memory bound: each load waits for the
 *                   one before it and misses the caches);
 *   "branchy"       sums the elements of random data above a threshold (bad speculation: the
 *                   branch goes either way at random).
 *
 * Build (from the repository root, after `cargo build -p topdown-region`):
 *   cc -O2 -Itopdown-region/include topdown-region/examples/regions.c \
 *      target/debug/libtopdown_region.a -lpthread -ldl -lm -o regions-c
 * Run: TOPDOWN_REGION_MODEL=intel-icl ./regions-c [out.json]   (default model: software)
 *      topdown report -i out.json --by function
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "topdown_region.h"

#define CHASE_ELEMENTS (4u << 20) /* 4 Mi pointers: 32 MiB, past the caches */
#define CHASE_STEPS (2u << 20)
#define BRANCH_ELEMENTS (4u << 20)

static uint64_t next_random(uint64_t *state) {
    /* xorshift64: a fixed, cheap sequence, the same on every run. */
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

static size_t pointer_chase(const size_t *next, unsigned steps) {
    size_t at = 0;
    for (unsigned i = 0; i < steps; i++)
        at = next[at];
    return at;
}

static uint64_t branchy(const uint32_t *data, unsigned count) {
    uint64_t sum = 0;
    for (unsigned i = 0; i < count; i++)
        if (data[i] & 0x80000000u) {
            sum += data[i];
            /* Keeps this a branch: without it the compiler may use a conditional move (or
             * vector code), and nothing is left to mispredict. */
            __asm__ volatile("" ::: "memory");
        }
    return sum;
}

int main(int argc, char **argv) {
    if (td_region_init(NULL, 0) != 0)
        fprintf(stderr, "regions-c: no counters: %s\n", td_region_message());

    uint64_t state = 0x9e3779b97f4a7c15ull;
    /* A single random cycle through every element (Sattolo's shuffle). */
    size_t *next = malloc(CHASE_ELEMENTS * sizeof *next);
    uint32_t *data = malloc(BRANCH_ELEMENTS * sizeof *data);
    if (next == NULL || data == NULL) {
        fprintf(stderr, "regions-c: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < CHASE_ELEMENTS; i++)
        next[i] = i;
    for (size_t i = CHASE_ELEMENTS - 1; i > 0; i--) {
        size_t j = next_random(&state) % i;
        size_t swap = next[i];
        next[i] = next[j];
        next[j] = swap;
    }
    for (size_t i = 0; i < BRANCH_ELEMENTS; i++)
        data[i] = (uint32_t)next_random(&state);

    size_t end = 0;
    uint64_t sum = 0;
    for (int round = 0; round < 3; round++) {
        td_region_begin("pointer_chase");
        end += pointer_chase(next, CHASE_STEPS);
        td_region_end("pointer_chase");

        td_region_begin("branchy");
        sum += branchy(data, BRANCH_ELEMENTS);
        td_region_end("branchy");
    }
    printf("regions-c: chase ended at %zu, sum %llu\n", end, (unsigned long long)sum);
    printf("regions-c: counters read by path %d: %s\n", td_region_path(), td_region_reason());
    td_region_print_summary();
    if (argc > 1 && td_region_write_json(argv[1]) != 0) {
        fprintf(stderr, "regions-c: %s\n", td_region_message());
        return 1;
    }
    free(next);
    free(data);
    return 0;
}
