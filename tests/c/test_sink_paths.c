/* The file sinks' paths through the C ABI: a directory (given as /tmp, as a
 * fresh directory, with a trailing slash), a missing directory and "/" are
 * refused when the sink is added, with a message naming the path; a target
 * that becomes a directory before the end fails at finish. No temporary
 * file (<name>.tmp-<pid>-<n>) is ever left behind. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"

/* Entries of `dir` whose name contains ".tmp-<this pid>-". */
static int leftovers(const char *dir) {
    char needle[64];
    int n = 0;
    struct dirent *e;
    DIR *d = opendir(dir);
    if (!d) return -1;
    snprintf(needle, sizeof needle, ".tmp-%ld-", (long)getpid());
    while ((e = readdir(d)) != NULL) {
        if (strstr(e->d_name, needle) != NULL) n++;
    }
    closedir(d);
    return n;
}

static int mentions(const char *text) { return strstr(memprobe_last_error(), text) != NULL; }

int main(void) {
    memprobe_source *cpu = NULL;
    memprobe_tracker *t = NULL;
    const memprobe_source *srcs[1];
    char dir[] = "/tmp/memprobe-sink-paths-XXXXXX", path[256];

    CHECK(mkdtemp(dir) != NULL);
    OK(memprobe_source_new_pushed("cpu", &cpu));
    OK(memprobe_source_push(cpu, 100));
    srcs[0] = cpu;
    OK(memprobe_tracker_new(srcs, 1, &t));

    /* A directory is refused at once, for both file sinks. */
    EXPECT(memprobe_tracker_add_jsonl_sink(t, "/tmp"), MEMPROBE_STATUS_INVALID_ARGUMENT);
    CHECK(mentions("/tmp") && mentions("is a directory"));
    EXPECT(memprobe_tracker_add_csv_sink(t, "/tmp"), MEMPROBE_STATUS_INVALID_ARGUMENT);
    EXPECT(memprobe_tracker_add_jsonl_sink(t, dir), MEMPROBE_STATUS_INVALID_ARGUMENT);
    CHECK(mentions(dir));
    EXPECT(memprobe_tracker_add_csv_sink(t, dir), MEMPROBE_STATUS_INVALID_ARGUMENT);
    snprintf(path, sizeof path, "%s/", dir);
    EXPECT(memprobe_tracker_add_jsonl_sink(t, path), MEMPROBE_STATUS_INVALID_ARGUMENT);
    EXPECT(memprobe_tracker_add_csv_sink(t, "/"), MEMPROBE_STATUS_INVALID_ARGUMENT);
    EXPECT(memprobe_tracker_add_jsonl_sink(t, "."), MEMPROBE_STATUS_INVALID_ARGUMENT);
    EXPECT(memprobe_tracker_add_jsonl_sink(t, ""), MEMPROBE_STATUS_INVALID_ARGUMENT);
    /* A missing directory: unavailable, naming it. */
    snprintf(path, sizeof path, "%s/missing/run.jsonl", dir);
    EXPECT(memprobe_tracker_add_jsonl_sink(t, path), MEMPROBE_STATUS_UNAVAILABLE);
    CHECK(mentions("does not exist"));
    /* A regular file where the directory should be. */
    snprintf(path, sizeof path, "%s/plain", dir);
    {
        FILE *f = fopen(path, "w");
        CHECK(f != NULL);
        if (f) fclose(f);
    }
    snprintf(path, sizeof path, "%s/plain/run.csv", dir);
    EXPECT(memprobe_tracker_add_csv_sink(t, path), MEMPROBE_STATUS_INVALID_ARGUMENT);
    CHECK(leftovers(dir) == 0);
    CHECK(leftovers("/tmp") == 0);
    CHECK(leftovers("/") == 0 || leftovers("/") == -1);

    /* Accepted, then the target turns into a directory: finish fails and
     * removes the temporary file; the records are not half-written anywhere. */
    snprintf(path, sizeof path, "%s/run.jsonl", dir);
    OK(memprobe_tracker_add_jsonl_sink(t, path));
    snprintf(path, sizeof path, "%s/run.csv", dir);
    OK(memprobe_tracker_add_csv_sink(t, path));
    CHECK(leftovers(dir) == 2);
    OK(memprobe_tracker_begin(t, MEMPROBE_PHASE_KIND_EPOCH, NULL));
    OK(memprobe_source_push(cpu, 200));
    OK(memprobe_tracker_end(t, MEMPROBE_PHASE_KIND_EPOCH, NULL, NULL, NULL, 0));
    snprintf(path, sizeof path, "%s/run.jsonl", dir);
    CHECK(mkdir(path, 0700) == 0);
    snprintf(path, sizeof path, "%s/run.jsonl/inside", dir);
    CHECK(mkdir(path, 0700) == 0);
    EXPECT(memprobe_tracker_finish_sinks(t), MEMPROBE_STATUS_INVALID_ARGUMENT);
    CHECK(mentions("run.jsonl"));
    CHECK(leftovers(dir) == 0);
    /* The CSV sink beside it still finished. */
    snprintf(path, sizeof path, "%s/run.csv", dir);
    {
        struct stat st;
        CHECK(stat(path, &st) == 0 && st.st_size > 0);
    }

    /* Sinks left for memprobe_tracker_free: renamed into place there. */
    snprintf(path, sizeof path, "%s/late.jsonl", dir);
    OK(memprobe_tracker_add_jsonl_sink(t, path));
    CHECK(leftovers(dir) == 1);
    OK(memprobe_tracker_free(t));
    CHECK(leftovers(dir) == 0);
    CHECK(access(path, F_OK) == 0);
    OK(memprobe_source_free(cpu));

    /* Clean up. */
    unlink(path);
    snprintf(path, sizeof path, "%s/run.csv", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/plain", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/run.jsonl/inside", dir);
    rmdir(path);
    snprintf(path, sizeof path, "%s/run.jsonl", dir);
    rmdir(path);
    CHECK(rmdir(dir) == 0);
    return check_summary();
}
