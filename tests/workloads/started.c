// `cargo xtask bench`'s start-up section: prints `started_ns=` (CLOCK_MONOTONIC when main
// began: when the program was handed the CPU, under a tracer or not), then calls work() once,
// the function the tracers probe. With arguments it execs them instead, so a program that
// loads a probed library is timed from the same moment.
#include <stdio.h>
#include <time.h>
#include <unistd.h>

__attribute__((noinline)) int work(int x) { return 3 * x + 1; }

int main(int argc, char **argv) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    printf("started_ns=%lld\n", (long long)now.tv_sec * 1000000000LL + now.tv_nsec);
    fflush(stdout);
    if (argc > 1) {
        execvp(argv[1], argv + 1);
        perror("execvp");
        return 127;
    }
    return work(argc) == 4 ? 0 : 1;
}
