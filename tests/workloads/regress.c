// Workload for `topdown diff`: `regress REQUESTS PARSE_SLOTS` calls handle_request REQUESTS
// times; each call runs parse_request, which makes PARSE_SLOTS getppid calls (the `slots` of
// `--pmu synthetic:intel-icl`) and as many getresuid (backend bound), and lookup_key, which
// makes 50 getppid and 50 getpgid (retiring). Doubling PARSE_SLOTS doubles parse_request's
// cost per call and nothing else's own.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

static int parse_slots;

__attribute__((noinline)) void parse_request(void) {
    unsigned r, e, s;
    for (int i = 0; i < parse_slots; i++) syscall(SYS_getppid);
    for (int i = 0; i < parse_slots; i++) syscall(SYS_getresuid, &r, &e, &s);
}

__attribute__((noinline)) void lookup_key(void) {
    for (int i = 0; i < 50; i++) syscall(SYS_getppid);
    for (int i = 0; i < 50; i++) syscall(SYS_getpgid, 0);
}

__attribute__((noinline)) void handle_request(void) {
    for (int i = 0; i < 10; i++) syscall(SYS_getppid);
    parse_request();
    lookup_key();
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    int requests = atoi(argv[1]);
    parse_slots = atoi(argv[2]);
    for (int i = 0; i < requests; i++) handle_request();
    printf("pid=%d\n", getpid());
    return 0;
}
