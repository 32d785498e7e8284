/* What the C test programs share: their start on the synthetic model (slots = getppid calls)
 * and the getppid calls they count. Included by exact.c and fork.c. */
#include <stdio.h>
#include <unistd.h>

#include "topdown_region.h"

/* Checks the argument count (`usage` names the arguments) and sets up synthetic:intel-icl at
 * level 1. Returns 0, or the exit status after saying what failed. */
static int start_synthetic(int argc, int expected_argc, const char *usage) {
    if (argc != expected_argc) {
        fprintf(stderr, "usage: %s\n", usage);
        return 2;
    }
    if (td_region_init("synthetic:intel-icl", 1) != 0) {
        fprintf(stderr, "init: %s\n", td_region_message());
        return 2;
    }
    return 0;
}

static void getppid_times(int times) {
    for (int i = 0; i < times; i++)
        getppid();
}
