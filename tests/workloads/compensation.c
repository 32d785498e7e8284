// Probe-cost compensation workload for topdown's integration tests. `work` runs the same work
// through functions topdown probes (outer -> spin, empty: three probed calls per unit) and,
// interleaved in blocks, through unprobed copies of them called from one probed wrapper
// (reference: one probed call per block). Both are measured by topdown's own counters in the
// same run, so the compensated figure of outer can be held against reference's.
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

// Each function on its own 64-byte boundary: the probed and unprobed copies of a loop then have
// the same alignment and run at the same speed (unaligned, one copy ran 60% slower here).
#define ALIGNED __attribute__((noinline, aligned(64)))

// Units of work per reference() call.
#define BLOCK 10

// Probed: outer() calls spin() and empty(), each once.
ALIGNED void empty(void) { __asm__ volatile(""); }

ALIGNED void spin(long n) {
    for (volatile long i = 0; i < n; i++) {
    }
}

ALIGNED void outer(long n) {
    spin(n);
    empty();
}

// Never probed: the same code under other names.
ALIGNED void empty_unprobed(void) { __asm__ volatile(""); }

ALIGNED void spin_unprobed(long n) {
    for (volatile long i = 0; i < n; i++) {
    }
}

ALIGNED void outer_unprobed(long n) {
    spin_unprobed(n);
    empty_unprobed();
}

// Probed: `units` units of unprobed work in one call.
ALIGNED void reference(long units, long n) {
    for (long i = 0; i < units; i++) outer_unprobed(n);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "empty")) {
        long calls = atol(argv[2]);
        for (long i = 0; i < calls; i++) empty();
        return 0;
    }
    if (argc == 4 && !strcmp(argv[1], "work")) {
        long units = atol(argv[2]), n = atol(argv[3]);
        // Both paths once before counting starts to matter (first-touch page faults).
        outer_unprobed(n);
        for (long done = 0; done < units; done += BLOCK) {
            long block = units - done < BLOCK ? units - done : BLOCK;
            reference(block, n);
            for (long i = 0; i < block; i++) outer(n);
        }
        return 0;
    }
    return 2;
}
