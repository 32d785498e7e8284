/* Regions across fork(): the child's counters must be its own (pid-0 counters follow the
 * thread that opened them, so the child cannot reuse the parent's). Run by tests/c_api.rs.
 * Arguments: the parent's and the child's JSON report paths. */
#include <sys/wait.h>

#include "synthetic.h"

int main(int argc, char **argv) {
    start_synthetic(argc, 3, "fork PARENT.json CHILD.json");
    td_region_begin("parent");
    getppid_times(10);
    pid_t child = fork();
    if (child < 0)
        return 2;
    if (child == 0) {
        td_region_begin("child");
        getppid_times(300);
        td_region_end("child");
        return td_region_write_json(argv[2]) == 0 ? 0 : 1;
    }
    int status = 0;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return 3;
    getppid_times(5);
    td_region_end("parent");
    return td_region_write_json(argv[1]) == 0 ? 0 : 1;
}
