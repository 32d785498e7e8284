/* An untraced process beside a traced run, using the same library copy: it calls strlen and
 * memchr (probed there) in rounds until the file argv[1] exists, appending each round's CPU
 * time per call (ns) to argv[2]. Every round computes the same sum; stdout gets that sum and
 * whether every round agreed, so a probe that changed what it computes shows. */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CALLS 20000

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 3)
        return 2;
    static char text[64];
    for (size_t i = 0; i + 1 < sizeof text; i++)
        text[i] = 'a' + i % 26;
    long first = -1;
    int agreed = 1, rounds = 0;
    while (access(argv[1], F_OK) != 0 || rounds < 3) {
        double start = now_ns();
        long sum = 0;
        for (int i = 0; i < CALLS; i++) {
            char *volatile s = text + i % 40;
            sum += (long)strlen(s);
            sum += memchr(s, 'z', strlen(s)) != NULL;
        }
        double per_call = (now_ns() - start) / (2.0 * CALLS);
        FILE *log = fopen(argv[2], "a");
        if (!log)
            return 3;
        fprintf(log, "%.2f\n", per_call);
        fclose(log);
        if (first < 0)
            first = sum;
        agreed &= sum == first;
        rounds++;
        usleep(20000);
    }
    printf("sum per round %ld, all rounds agree: %s\n", first, agreed ? "yes" : "no");
    return 0;
}
