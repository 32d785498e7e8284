/* What the C test programs share: their start on the synthetic model (slots = getppid calls)
 * and the getppid calls they count. Included by exact.c and fork.c. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "topdown_region.h"

/* Checks the argument count (`usage` names the arguments) and sets up synthetic:intel-icl at
 * level 1; says what failed and exits with status 2 if either does not hold, so that every
 * program starts with this one call. */
static void start_synthetic(int argc, int expected_argc, const char *usage) {
    if (argc != expected_argc) {
        fprintf(stderr, "usage: %s\n", usage);
        exit(2);
    }
    if (td_region_init("synthetic:intel-icl", 1) != 0) {
        fprintf(stderr, "init: %s\n", td_region_message());
        exit(2);
    }
}

static void getppid_times(int times) {
    for (int i = 0; i < times; i++)
        getppid();
}
