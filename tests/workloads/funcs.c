// Probed-function workload for topdown's integration tests: every function makes a known
// number of raw syscalls, so synthetic counters give exact inclusive/exclusive answers.
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <errno.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

__attribute__((noinline)) void leaf(int n) {
    for (int i = 0; i < n; i++) syscall(SYS_getppid);
}

__attribute__((noinline)) void mid(int k, int n, int m) {
    for (int i = 0; i < k; i++) leaf(n);
    for (int i = 0; i < m; i++) syscall(SYS_getpgid, 0);
}

// Not a tail call (the + 1), so every level has its own frame and return.
__attribute__((noinline)) int recurse(int depth) {
    syscall(SYS_getppid);
    if (depth > 1) return recurse(depth - 1) + 1;
    return 1;
}

// N getppid (slots) and N calls of the category's syscall: getpgid (retiring) for kind 0,
// getresuid (backend bound) for kind 1, so fast and slow calls differ in why.
__attribute__((noinline)) void band(int n, int kind) {
    unsigned r, e, s;
    for (int i = 0; i < n; i++) syscall(SYS_getppid);
    for (int i = 0; i < n; i++) {
        if (kind == 0)
            syscall(SYS_getpgid, 0);
        else
            syscall(SYS_getresuid, &r, &e, &s);
    }
}

static jmp_buf env;

__attribute__((noinline)) void jumper(int n) {
    for (int i = 0; i < n; i++) syscall(SYS_getppid);
    longjmp(env, 1);
}

static int pipe_fds[2];

static void pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) exit(4);
}

// Blocks inside a probed function until the other thread has made its calls; with `migrate`
// it then moves to CPU 1 before its second half, so the call spans two CPUs.
__attribute__((noinline)) void blocker(int n, int migrate) {
    char byte;
    for (int i = 0; i < n; i++) syscall(SYS_getppid);
    if (read(pipe_fds[0], &byte, 1) != 1) exit(3);
    if (migrate) pin(1);
    for (int i = 0; i < n; i++) syscall(SYS_getppid);
}

// Calls the libc wrapper, for `-u libc:getppid`.
__attribute__((noinline)) void via_libc(int n) {
    for (int i = 0; i < n; i++) getppid();
}

// leaf(1) RATE times a second for SECONDS, each call at its own deadline on the monotonic
// clock: a late wake-up is caught up, so any span of D seconds holds RATE * D calls, give or
// take the lateness at its two ends.
static void steady(long rate, double seconds) {
    struct timespec start, at;
    clock_gettime(CLOCK_MONOTONIC, &start);
    long calls = (long)(rate * seconds);
    for (long i = 0; i < calls; i++) {
        long long ns = start.tv_nsec + i * 1000000000LL / rate;
        at.tv_sec = start.tv_sec + ns / 1000000000LL;
        at.tv_nsec = ns % 1000000000LL;
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL) == EINTR) {
        }
        leaf(1);
    }
}

static pthread_barrier_t crowd_barrier;
static int crowd_calls;

// N getppid, then waits until every thread of the crowd is inside it, then N more: all of
// them are inside a probed call at once.
__attribute__((noinline)) void crowded(int n) {
    for (int i = 0; i < n; i++) syscall(SYS_getppid);
    pthread_barrier_wait(&crowd_barrier);
    for (int i = 0; i < n; i++) syscall(SYS_getppid);
}

static void *crowd_member(void *arg) {
    (void)arg;
    crowded(crowd_calls);
    return NULL;
}

static int other_calls;
static void *other(void *arg) {
    (void)arg;
    pin(0);
    for (int i = 0; i < other_calls; i++) syscall(SYS_getppid);
    if (write(pipe_fds[1], "x", 1) != 1) exit(3);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    if (!strcmp(argv[1], "leafmid") && argc == 5) {
        mid(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
        leaf(atoi(argv[3]));
    } else if (!strcmp(argv[1], "recurse") && argc == 3) {
        recurse(atoi(argv[2]));
        leaf(7);
    } else if (!strcmp(argv[1], "longjmp") && argc == 3) {
        if (setjmp(env) == 0) jumper(atoi(argv[2]));
        leaf(5);
    } else if (!strcmp(argv[1], "longjmps") && argc == 4) {
        // K longjmps out of jumper(N), each followed by leaf(1): more skipped returns than
        // the kernel's 64 nested return instances.
        for (volatile int i = 0; i < atoi(argv[2]); i++) {
            if (setjmp(env) == 0) jumper(atoi(argv[3]));
            leaf(1);
        }
    } else if (!strcmp(argv[1], "block") && argc == 5) {
        // Thread A blocks in blocker() on CPU 0 (or migrates to CPU 1 inside it when
        // argv[4] is "migrate") while thread B makes argv[3] calls on CPU 0.
        pthread_t thread;
        if (pipe(pipe_fds) != 0) return 3;
        other_calls = atoi(argv[3]);
        pin(0);
        if (pthread_create(&thread, NULL, other, NULL) != 0) return 3;
        blocker(atoi(argv[2]), !strcmp(argv[4], "migrate"));
        pthread_join(thread, NULL);
    } else if (!strcmp(argv[1], "crowd") && argc == 4) {
        // argv[2] threads inside crowded(argv[3]) at once.
        int threads = atoi(argv[2]);
        crowd_calls = atoi(argv[3]);
        pthread_t *ids = calloc(threads, sizeof *ids);
        if (!ids || pthread_barrier_init(&crowd_barrier, NULL, threads) != 0) return 3;
        for (int i = 0; i < threads; i++)
            if (pthread_create(&ids[i], NULL, crowd_member, NULL) != 0) return 3;
        for (int i = 0; i < threads; i++) pthread_join(ids[i], NULL);
    } else if (!strcmp(argv[1], "steady") && argc == 4) {
        steady(atol(argv[2]), atof(argv[3]));
    } else if (!strcmp(argv[1], "bands") && argc == 6) {
        // argv[2] calls of band(argv[3], 0), then argv[4] calls of band(argv[5], 1).
        for (int i = 0; i < atoi(argv[2]); i++) band(atoi(argv[3]), 0);
        for (int i = 0; i < atoi(argv[4]); i++) band(atoi(argv[5]), 1);
    } else if (!strcmp(argv[1], "bandlist") && argc >= 3) {
        // band(N, 0) once for each N given.
        for (int i = 2; i < argc; i++) band(atoi(argv[i]), 0);
    } else if (!strcmp(argv[1], "libc") && argc == 3) {
        via_libc(atoi(argv[2]));
    } else if (!strcmp(argv[1], "wait") && argc == 5) {
        // Attach test: wait for a line on stdin, then run leafmid.
        char line[16];
        printf("pid=%d\n", getpid());
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin)) return 3;
        mid(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
        return 0;
    } else {
        return 2;
    }
    printf("pid=%d\n", getpid());
    return 0;
}
