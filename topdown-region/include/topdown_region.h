/*
 * topdown-region: TopDown counters around named regions of your own program.
 *
 * Link with libtopdown_region.a (plus -lpthread -ldl -lm) or libtopdown_region.so, both built
 * by `cargo build -p topdown-region`. Same API as the Rust crate (topdown-region/src/lib.rs).
 *
 * Each thread that begins a region opens the model's counters for itself. They are read in
 * user space (rdpmc on x86_64, mrs on arm64) when every counter's perf mmap page allows it,
 * and with read() otherwise (software and tracepoint counters, VMs, rdpmc disabled):
 * td_region_path() says which, td_region_reason() why. Nothing here aborts the program:
 * misuse (an end without a begin, a mismatched name, nesting deeper than 64, a thread exiting
 * inside a region) is counted and reported, and a failure to open counters leaves the
 * regions counting calls only.
 *
 * Regions shorter than a few microseconds are not worth measuring: out-of-order execution
 * overlaps the code around the reads (perf's topdown.txt).
 */
#ifndef TOPDOWN_REGION_H
#define TOPDOWN_REGION_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What td_region_path() returns. */
#define TD_REGION_PATH_DISABLED 0 /* no counters: regions count calls only */
#define TD_REGION_PATH_READ 1     /* read() system calls */
#define TD_REGION_PATH_RDPMC 2    /* x86_64 rdpmc */
#define TD_REGION_PATH_MRS 3      /* arm64 mrs */

/*
 * Sets the model (a `topdown --pmu` name such as "intel-icl", "software",
 * "synthetic:intel-icl"; NULL: $TOPDOWN_REGION_MODEL, else "software") and TopDown level
 * (1 or 2; 0: $TOPDOWN_REGION_LEVEL, else 1). Call before the first region; without it the
 * first region sets the library up from the environment. Returns 0, or -1 with the reason
 * in td_region_message() (the library then works without counters).
 */
int td_region_init(const char *model, int level);

/* Opens / closes region `name` on the calling thread. Regions nest. */
void td_region_begin(const char *name);
void td_region_end(const char *name);

/* The calling thread's TD_REGION_PATH_* and why (valid until this thread's next call). */
int td_region_path(void);
const char *td_region_reason(void);

/* The last error of td_region_init / td_region_write_json on this thread. */
const char *td_region_message(void);

/*
 * Writes every thread's regions as topdown JSON (render with `topdown report -i FILE
 * --by function`). Returns 0, or -1 with the reason in td_region_message().
 */
int td_region_write_json(const char *path);

/* Prints each thread's path and each region's counts and metrics to stderr. */
void td_region_print_summary(void);

/* Misuse counted so far on all threads. */
uint64_t td_region_misuse_count(void);

#ifdef __cplusplus
}
#endif

#endif /* TOPDOWN_REGION_H */
