/* Exits of real optimised code (built with -O2 by tests/tests/real_programs.rs): GCC's
 * hot/cold splitting (h.cold), direct and indirect tail calls, a switch jump table, and
 * functions whose first instruction the kernel emulates or single-steps. Known numbers of
 * getppid (synthetic `slots`) and getpgid (`topdown-retiring`) calls make every figure exact.
 *
 * usage: exits cold N | tails N | plt N | entries N
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

__attribute__((cold, noinline)) void rare(int x) {
    if (x < 0)
        abort();
}

__attribute__((noinline)) int finish(int x) {
    getppid();
    return x + 1;
}

/* The rare branch goes to h.cold, which leaves h from there by a tail call to finish: an exit
 * of h in its fragment (`jmp finish`), whose callee's getppid belongs to h's inclusive
 * figure. */
__attribute__((noinline)) int h(int x) {
    if (__builtin_expect(x % 100 == 0, 0)) {
        rare(x);
        getppid();
        return finish(x);
    }
    getppid();
    return x;
}

__attribute__((noinline)) void callee(int n) {
    for (int i = 0; i < n; i++)
        getppid();
}

/* Ends in `jmp callee`: its inclusive figure must include callee's getppid calls. */
__attribute__((noinline)) void tail_direct(int n) {
    getpgid(0);
    callee(n);
}

/* Ends in `jmp getppid@plt`: the getppid in libc belongs to its inclusive figure. */
__attribute__((noinline)) void tail_libc(void) {
    getpgid(0);
    getppid();
}

__attribute__((noinline)) void handler(int n) {
    for (int i = 0; i < n; i++)
        getppid();
}

void (*volatile pointer)(int) = handler;

/* A switch jump table (`jmp *%rax` inside the function) and an indirect tail call
 * (`jmp *%rax` to handler) in one function. */
__attribute__((noinline)) void dispatch(int kind, int n) {
    switch (kind) {
    case 0: getpgid(0); break;
    case 1: getpgid(0); getpgid(0); break;
    case 2: getpgid(0); getpgid(0); getpgid(0); break;
    case 3: getpgid(0); getpgid(0); getpgid(0); getpgid(0); break;
    case 4: getpgid(0); getpgid(0); getpgid(0); getpgid(0); getpgid(0); break;
    case 5: getpgid(0); getpgid(0); getpgid(0); getpgid(0); getpgid(0); getpgid(0); break;
    default: break;
    }
    pointer(n);
}

/* push %rbp first (emulated by the kernel) and mov first (single-stepped). */
__asm__(".text\n"
        ".globl starts_with_push\n.type starts_with_push,@function\n"
        "starts_with_push:\n push %rbp\n mov %rsp,%rbp\n pop %rbp\n ret\n"
        ".size starts_with_push,.-starts_with_push\n"
        ".globl starts_with_mov\n.type starts_with_mov,@function\n"
        "starts_with_mov:\n mov %rdi,%rax\n ret\n"
        ".size starts_with_mov,.-starts_with_mov\n");
void starts_with_push(void);
long starts_with_mov(long);

int main(int argc, char **argv) {
    if (argc < 3)
        return 2;
    int n = atoi(argv[2]);
    long sum = 0;
    if (strcmp(argv[1], "cold") == 0) {
        for (int i = 0; i < n; i++)
            sum += h(i);
    } else if (strcmp(argv[1], "tails") == 0) {
        for (int i = 0; i < n; i++) {
            tail_direct(3);
            dispatch(i % 8, 2);
        }
    } else if (strcmp(argv[1], "plt") == 0) {
        for (int i = 0; i < n; i++)
            tail_libc();
    } else if (strcmp(argv[1], "entries") == 0) {
        for (int i = 0; i < n; i++) {
            starts_with_push();
            sum += starts_with_mov(i);
        }
    } else {
        return 2;
    }
    return sum == -1;
}
