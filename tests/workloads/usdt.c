// USDT workload for topdown's span and -U tests: probes from sys/sdt.h (systemtap-sdt-dev)
// around known numbers of getppid calls (the synthetic `slots` counter), probes whose
// argument specs are written out exactly (every operand form, with known values), and a
// semaphore-guarded probe (in usdt_guarded.c) that fires only while a tracer enables it.
//
// usdt spans N       requests keyed 1..3 making key*N getppid calls each, inside a batch;
//                    one request that longjmps out (abandoned, N calls), one reset by
//                    test:reset (abandoned, 2N calls), named requests "alpha" (N) and "beta"
//                    (2N), each twice
// usdt forms R       every argument form R times (test:form, one site per form), each
//                    followed by test:form_end
// usdt guarded N     the guarded probe N times; prints how many fired
// usdt block N M [migrate]
//                    two threads on CPU 0: A opens request 7, makes N calls and blocks;
//                    meanwhile B makes request 8 of M calls and wakes A, which makes N more
//                    (after moving to CPU 1 with `migrate`) and closes request 7
// usdt crowd T N     T threads, each in request 5 at once: N calls, a barrier all T reach
//                    inside their span, N more
// usdt watch         prints the guarded probe's semaphore for each line read on stdin
// usdt bands F NF S NS
//                    F requests keyed 6 of NF getppid calls (plus NF getpgid: retiring),
//                    then S keyed 6 of NS (plus NS getresuid: backend bound)
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sdt.h>
#include <sys/syscall.h>
#include <unistd.h>

long sdt_global = 0x1122334455667788;
int sdt_array[6] = {11, -22, 33, -44, 55, -66};

int guarded(int n);
unsigned short guarded_semaphore(void);

static void work(int n) {
    for (int i = 0; i < n; i++) syscall(SYS_getppid);
}

// One request of `n` slots, all of one TopDown category: retiring (kind 0) or backend bound.
__attribute__((noinline)) static void band_request(int n, int kind) {
    unsigned r, e, s;
    STAP_PROBE1(test, request_start, 6);
    work(n);
    for (int i = 0; i < n; i++) {
        if (kind == 0)
            syscall(SYS_getpgid, 0);
        else
            syscall(SYS_getresuid, &r, &e, &s);
    }
    STAP_PROBE1(test, request_done, 6);
}

static jmp_buf env;

__attribute__((noinline)) static void failing_request(int n) {
    STAP_PROBE1(test, request_start, 9);
    work(n);
    longjmp(env, 1);
}

__attribute__((noinline)) static void spans(int n) {
    STAP_PROBE(test, batch_start);
    for (int key = 1; key <= 3; key++) {
        STAP_PROBE1(test, request_start, key);
        work(key * n);
        STAP_PROBE1(test, request_done, key);
    }
    if (setjmp(env) == 0) failing_request(n);
    // The next start closes the request the longjmp left open.
    STAP_PROBE1(test, request_start, 4);
    work(4 * n);
    STAP_PROBE1(test, request_done, 4);
    STAP_PROBE1(test, request_start, 5);
    work(2 * n);
    STAP_PROBE(test, reset);
    STAP_PROBE(test, batch_done);
    const char *names[] = {"alpha", "beta", "alpha", "beta"};
    for (int i = 0; i < 4; i++) {
        STAP_PROBE2(test, named_start, names[i], strlen(names[i]));
        work((i % 2 + 1) * n);
        STAP_PROBE(test, named_done);
    }
}

// One site of test:form per operand form, its value known; in extended asm, so %% is %.
__attribute__((noinline)) static void forms(void) {
    __asm__ __volatile__("movabs $0x7fffffffffff0001, %%rax\n\t"
                         STAP_PROBE_ASM(test, form, 8@%%rax) ::: "rax");
    STAP_PROBE(test, form_end);
    __asm__ __volatile__("mov $0xfffffffe, %%ecx\n\t"
                         STAP_PROBE_ASM(test, form, -4@%%ecx) ::: "rcx");
    STAP_PROBE(test, form_end);
    __asm__ __volatile__("movabs $0x123456789abcdef0, %%rdx\n\t"
                         STAP_PROBE_ASM(test, form, 2@%%dx) ::: "rdx");
    STAP_PROBE(test, form_end);
    __asm__ __volatile__("mov $0x1234abcd, %%eax\n\t"
                         STAP_PROBE_ASM(test, form, 1@%%ah) ::: "rax");
    STAP_PROBE(test, form_end);
    __asm__ __volatile__("mov $0xff, %%esi\n\t"
                         STAP_PROBE_ASM(test, form, -1@%%sil) ::: "rsi");
    STAP_PROBE(test, form_end);
    __asm__ __volatile__("movabs $0xdeadbeef00000007, %%r9\n\t"
                         STAP_PROBE_ASM(test, form, 4@%%r9d) ::: "r9");
    STAP_PROBE(test, form_end);
    __asm__ __volatile__(STAP_PROBE_ASM(test, form, -4@$-5) :::);
    STAP_PROBE(test, form_end);
    __asm__ __volatile__(STAP_PROBE_ASM(test, form, 8@$123456) :::);
    STAP_PROBE(test, form_end);
    __asm__ __volatile__("lea sdt_array(%%rip), %%rdi\n\t"
                         STAP_PROBE_ASM(test, form, 4@(%%rdi)) ::: "rdi");
    STAP_PROBE(test, form_end);
    __asm__ __volatile__("lea sdt_array(%%rip), %%rdi\n\t"
                         STAP_PROBE_ASM(test, form, -4@4(%%rdi)) ::: "rdi");
    STAP_PROBE(test, form_end);
    __asm__ __volatile__("lea sdt_array(%%rip), %%rdi\n\t"
                         "mov $3, %%r10\n\t"
                         STAP_PROBE_ASM(test, form, -4@(%%rdi,%%r10,4)) ::: "rdi", "r10");
    STAP_PROBE(test, form_end);
    __asm__ __volatile__("lea 8+sdt_array(%%rip), %%r11\n\t"
                         STAP_PROBE_ASM(test, form, -4@(,%%r11,1)) ::: "r11");
    STAP_PROBE(test, form_end);
    __asm__ __volatile__(STAP_PROBE_ASM(test, form, 8@sdt_global(%%rip)) :::);
    STAP_PROBE(test, form_end);
    __asm__ __volatile__(STAP_PROBE_ASM(test, form, 4@16+sdt_array(%%rip)) :::);
    STAP_PROBE(test, form_end);
    __asm__ __volatile__(STAP_PROBE_ASM(test, form, -4@sdt_array+20(%%rip)) :::);
    STAP_PROBE(test, form_end);
    // On the stack, below a pushed value: (%rsp) after the push.
    __asm__ __volatile__("pushq $-77\n\t"
                         STAP_PROBE_ASM(test, form, -8@(%%rsp))
                         "popq %%rax\n\t" ::: "rax", "memory");
    STAP_PROBE(test, form_end);
}

static int a_blocked[2], b_done[2];
static int other_calls;

static void pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) exit(4);
}

// Thread B: waits until A is inside its span, then makes a span of its own on the same CPU.
static void *other(void *unused) {
    char byte;
    (void)unused;
    pin(0);
    if (read(a_blocked[0], &byte, 1) != 1) exit(3);
    STAP_PROBE1(test, request_start, 8);
    work(other_calls);
    STAP_PROBE1(test, request_done, 8);
    if (write(b_done[1], "x", 1) != 1) exit(3);
    return NULL;
}

// Thread A: a span that is switched out (and, with `migrate`, moved to CPU 1) in its middle.
static void blocked_span(int n, int migrate) {
    pthread_t thread;
    char byte;
    if (pipe(a_blocked) != 0 || pipe(b_done) != 0) exit(3);
    pin(0);
    if (pthread_create(&thread, NULL, other, NULL) != 0) exit(3);
    STAP_PROBE1(test, request_start, 7);
    work(n);
    if (write(a_blocked[1], "x", 1) != 1) exit(3);
    if (read(b_done[0], &byte, 1) != 1) exit(3);
    if (migrate) pin(1);
    work(n);
    STAP_PROBE1(test, request_done, 7);
    pthread_join(thread, NULL);
}

static pthread_barrier_t crowd_barrier;
static int crowd_calls;

static void *crowd_member(void *unused) {
    (void)unused;
    STAP_PROBE1(test, request_start, 5);
    work(crowd_calls);
    pthread_barrier_wait(&crowd_barrier);
    work(crowd_calls);
    STAP_PROBE1(test, request_done, 5);
    return NULL;
}

// `threads` threads inside one span each, all at once.
static void crowd(int threads, int calls) {
    pthread_t *ids = calloc(threads, sizeof *ids);
    crowd_calls = calls;
    if (!ids || pthread_barrier_init(&crowd_barrier, NULL, threads) != 0) exit(3);
    for (int i = 0; i < threads; i++)
        if (pthread_create(&ids[i], NULL, crowd_member, NULL) != 0) exit(3);
    for (int i = 0; i < threads; i++) pthread_join(ids[i], NULL);
    free(ids);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: usdt spans N | forms R | block N M [migrate] | crowd T N | bands F NF S NS | guarded N | watch\n");
        return 2;
    }
    int n = argc > 2 ? atoi(argv[2]) : 0;
    if (strcmp(argv[1], "spans") == 0) {
        spans(n);
    } else if (strcmp(argv[1], "forms") == 0) {
        for (int i = 0; i < n; i++) forms();
    } else if (strcmp(argv[1], "block") == 0 && argc >= 4) {
        other_calls = atoi(argv[3]);
        blocked_span(n, argc > 4 && strcmp(argv[4], "migrate") == 0);
    } else if (strcmp(argv[1], "bands") == 0 && argc == 6) {
        for (int i = 0; i < atoi(argv[2]); i++) band_request(atoi(argv[3]), 0);
        for (int i = 0; i < atoi(argv[4]); i++) band_request(atoi(argv[5]), 1);
    } else if (strcmp(argv[1], "crowd") == 0 && argc == 4) {
        crowd(n, atoi(argv[3]));
    } else if (strcmp(argv[1], "guarded") == 0) {
        printf("fired %d\n", guarded(n));
    } else if (strcmp(argv[1], "watch") == 0) {
        char line[64];
        setvbuf(stdout, NULL, _IOLBF, 0);
        printf("ready\n");
        while (fgets(line, sizeof line, stdin)) {
            printf("semaphore %u\n", guarded_semaphore());
        }
    } else {
        return 2;
    }
    return 0;
}
