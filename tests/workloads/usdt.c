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
// usdt watch         prints the guarded probe's semaphore for each line read on stdin
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

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: usdt spans N | forms R | guarded N | watch\n");
        return 2;
    }
    int n = argc > 2 ? atoi(argv[2]) : 0;
    if (strcmp(argv[1], "spans") == 0) {
        spans(n);
    } else if (strcmp(argv[1], "forms") == 0) {
        for (int i = 0; i < n; i++) forms();
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
