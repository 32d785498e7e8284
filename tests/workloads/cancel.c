// pthread_cancel through a probed function: a thread makes N getppid calls in cancelled(),
// then waits in a cancellation point until the main thread cancels it. Its frame ends by the
// cancellation's forced unwind, never by a return. `cancel N K`: K threads, one after another.
// `exit N K`: see exit_inside_calls.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static int pipe_fds[2];

__attribute__((noinline)) void cancelled(int n) {
    for (int i = 0; i < n; i++) syscall(SYS_getppid);
    if (write(pipe_fds[1], "x", 1) != 1) exit(3);
    for (;;) pause();  // a cancellation point (pthreads(7))
}

static void *thread(void *arg) {
    cancelled(*(int *)arg);
    return NULL;
}

// `exit N K`: K threads each wait in stuck() after N getppid calls; then the main thread calls
// exit() inside quitter(). The group exit ends every thread without unwinding any frame.
__attribute__((noinline)) void stuck(int n) {
    for (int i = 0; i < n; i++) syscall(SYS_getppid);
    if (write(pipe_fds[1], "x", 1) != 1) exit(3);
    for (;;) pause();
}

static void *stuck_thread(void *arg) {
    stuck(*(int *)arg);
    return NULL;
}

__attribute__((noinline)) void quitter(int n) {
    for (int i = 0; i < n; i++) syscall(SYS_getppid);
    printf("exiting\n");
    exit(0);
}

static int exit_inside_calls(int calls, int threads) {
    if (pipe(pipe_fds) != 0) return 3;
    for (int i = 0; i < threads; i++) {
        pthread_t id;
        char byte;
        if (pthread_create(&id, NULL, stuck_thread, &calls) != 0) return 3;
        if (read(pipe_fds[0], &byte, 1) != 1) return 3;
    }
    quitter(calls);
    return 3;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "exit")) return exit_inside_calls(atoi(argv[2]), atoi(argv[3]));
    if (argc != 4 || strcmp(argv[1], "cancel")) return 2;
    int calls = atoi(argv[2]), threads = atoi(argv[3]), ended = 0;
    if (pipe(pipe_fds) != 0) return 3;
    for (int i = 0; i < threads; i++) {
        pthread_t id;
        char byte;
        void *result;
        if (pthread_create(&id, NULL, thread, &calls) != 0) return 3;
        if (read(pipe_fds[0], &byte, 1) != 1) return 3;
        if (pthread_cancel(id) != 0) return 3;
        if (pthread_join(id, &result) != 0) return 3;
        ended += result == PTHREAD_CANCELED;
    }
    printf("cancelled=%d\n", ended);
    return 0;
}
