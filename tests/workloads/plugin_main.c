// A plain C program whose library (plugin.cpp) throws and catches C++ exceptions below a
// probed C function: `plugin_main K N M`: K times work(N, M), which makes N getppid calls and
// calls plugin_work(M).
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

int plugin_work(int m);

__attribute__((noinline)) int work(int n, int m) {
    for (int i = 0; i < n; i++) syscall(SYS_getppid);
    return plugin_work(m);
}

int main(int argc, char **argv) {
    if (argc != 4) return 2;
    int times = atoi(argv[1]), caught = 0;
    for (int i = 0; i < times; i++) caught += work(atoi(argv[2]), atoi(argv[3]));
    printf("caught=%d\n", caught);
    return 0;
}
