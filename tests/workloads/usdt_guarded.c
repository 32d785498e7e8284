// The semaphore-guarded probe of usdt.c, in a file of its own: with _SDT_HAS_SEMAPHORES every
// probe of a translation unit records a semaphore, which the tests want only here.
#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>

// The tracer's reference count, in .probes as `dtrace -h` declares it.
unsigned short test_guarded_semaphore __attribute__((unused, section(".probes")));

unsigned short guarded_semaphore(void) {
    return *(volatile unsigned short *)&test_guarded_semaphore;
}

int guarded(int n) {
    int fired = 0;
    for (int i = 0; i < n; i++) {
        if (guarded_semaphore()) {
            STAP_PROBE1(test, guarded, i);
            fired++;
        }
    }
    return fired;
}
