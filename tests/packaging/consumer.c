/*
 * A program built against an installed memprobe (pkg-config or CMake):
 * opens this process's source, reads it, and prints the reading.
 */
#include <stdio.h>
#include <string.h>

#include <memprobe.h>

int main(void) {
    memprobe_source *rss = NULL;
    memprobe_sample s;
    memprobe_source_info info;
    memprobe_status st;

    if (strncmp(memprobe_soname(), "libmemprobe.so.", 15) != 0) {
        fprintf(stderr, "consumer: odd soname %s\n", memprobe_soname());
        return 1;
    }
    st = memprobe_source_new_process(0, &rss);
    if (st == MEMPROBE_STATUS_OK) st = memprobe_source_read(rss, &s);
    if (st == MEMPROBE_STATUS_OK) st = memprobe_source_get_info(rss, &info);
    if (st != MEMPROBE_STATUS_OK) {
        fprintf(stderr, "consumer: %s: %s\n", memprobe_status_name(st), memprobe_last_error());
        return 1;
    }
    printf("memprobe %s (header %d.%d.%d, %s): %s used %llu bytes\n", memprobe_version(), MEMPROBE_VERSION_MAJOR,
           MEMPROBE_VERSION_MINOR, MEMPROBE_VERSION_PATCH, memprobe_soname(), info.name, (unsigned long long)s.used);
    memprobe_source_free(rss);
    return s.used > 0 ? 0 : 1;
}
