// Call-tree workload for `--format svg`: nested probed functions, one of them (parse_json)
// with two callers, each doing its own known numbers of raw syscalls. Under
// `--pmu synthetic:intel-icl` getppid counts `slots` and getpgid, getsid, getpriority and
// getresuid count the retiring, bad-spec, fe-bound and be-bound slots, so each function has a
// known dominant TopDown category.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

static void work(int slots, int retiring, int bad, int frontend, int backend) {
    unsigned r, e, s;
    for (int i = 0; i < slots; i++) syscall(SYS_getppid);
    for (int i = 0; i < retiring; i++) syscall(SYS_getpgid, 0);
    for (int i = 0; i < bad; i++) syscall(SYS_getsid, 0);
    for (int i = 0; i < frontend; i++) syscall(SYS_getpriority, PRIO_PROCESS, 0);
    for (int i = 0; i < backend; i++) syscall(SYS_getresuid, &r, &e, &s);
}

__attribute__((noinline)) void parse_json(void) { work(100, 60, 5, 10, 25); }

__attribute__((noinline)) void hash_key(void) { work(40, 25, 5, 5, 5); }

__attribute__((noinline)) void lookup(void) {
    work(150, 20, 5, 10, 115);
    hash_key();
    hash_key();
}

__attribute__((noinline)) void dispatch(void) { work(60, 10, 35, 5, 10); }

__attribute__((noinline)) void handle_request(void) {
    work(30, 10, 5, 5, 10);
    parse_json();
    lookup();
    dispatch();
}

__attribute__((noinline)) void render_page(void) { work(120, 20, 10, 80, 10); }

__attribute__((noinline)) void load_config(void) {
    work(20, 5, 5, 5, 5);
    parse_json();
    parse_json();
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    int requests = atoi(argv[1]);
    load_config();
    for (int i = 0; i < requests; i++) handle_request();
    render_page();
    render_page();
    printf("pid=%d\n", getpid());
    return 0;
}
