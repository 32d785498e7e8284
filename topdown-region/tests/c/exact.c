/* The C API with exact synthetic counts (slots = getppid calls), its misuse counting and its
 * error returns; run by tests/c_api.rs. Argument: where to write the JSON report. */
#include "synthetic.h"

int main(int argc, char **argv) {
    start_synthetic(argc, 2, "exact OUT.json");
    td_region_begin("c-outer");
    getppid_times(1234);
    td_region_begin("c-inner");
    getppid_times(100);
    td_region_end("c-inner");
    td_region_end("c-outer");
    /* Misuse: counted, not fatal; NULL names are ignored. */
    td_region_end("never-begun");
    td_region_begin(NULL);
    td_region_end(NULL);
    printf("path %d\n", td_region_path());
    printf("misuse %llu\n", (unsigned long long)td_region_misuse_count());
    if (td_region_write_json(argv[1]) != 0) {
        fprintf(stderr, "write: %s\n", td_region_message());
        return 1;
    }
    if (td_region_write_json("/nonexistent-directory/out.json") != -1)
        return 3;
    printf("write error: %s\n", td_region_message());
    if (td_region_init("software", 1) != -1)
        return 4;
    printf("second init: %s\n", td_region_message());
    return 0;
}
