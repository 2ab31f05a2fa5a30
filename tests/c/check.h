/* A tiny test framework for memprobe's C tests: CHECK counts, never aborts,
 * and the program ends with "N passed, N failed". */
#ifndef MEMPROBE_CHECK_H
#define MEMPROBE_CHECK_H
#include <stdio.h>
#include <string.h>
#include "memprobe.h"

static int check_passed = 0, check_failed = 0;

#define CHECK(cond)                                                                 \
    do {                                                                            \
        if (cond) {                                                                 \
            check_passed++;                                                         \
        } else {                                                                    \
            check_failed++;                                                         \
            fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__, \
                    __LINE__, #cond, memprobe_last_error());                        \
        }                                                                           \
    } while (0)

/* A call that must return `want`, with a non-empty message unless OK. */
#define EXPECT(call, want)                                                            \
    do {                                                                              \
        memprobe_status got_ = (call);                                                \
        if (got_ == (memprobe_status)(want) &&                                        \
            ((want) == MEMPROBE_STATUS_OK) == (memprobe_last_error()[0] == '\0')) {   \
            check_passed++;                                                           \
        } else {                                                                      \
            check_failed++;                                                           \
            fprintf(stderr, "%s:%d: %s returned %u (%s), want %u; last error: '%s'\n", \
                    __FILE__, __LINE__, #call, (unsigned)got_,                        \
                    memprobe_status_name(got_), (unsigned)(want),                     \
                    memprobe_last_error());                                           \
        }                                                                             \
    } while (0)

#define OK(call) EXPECT(call, MEMPROBE_STATUS_OK)

/* A *_free that must succeed and leave the thread's last error as it was
 * (a finaliser freeing a handle must not erase a failed call's message). */
#define FREE_OK(call)                                                                  \
    do {                                                                               \
        char before_[512];                                                             \
        memprobe_status got_;                                                          \
        snprintf(before_, sizeof before_, "%s", memprobe_last_error());                \
        got_ = (call);                                                                 \
        if (got_ == MEMPROBE_STATUS_OK && strcmp(before_, memprobe_last_error()) == 0) { \
            check_passed++;                                                            \
        } else {                                                                       \
            check_failed++;                                                            \
            fprintf(stderr, "%s:%d: %s returned %u (%s); last error '%s', was '%s'\n",  \
                    __FILE__, __LINE__, #call, (unsigned)got_,                         \
                    memprobe_status_name(got_), memprobe_last_error(), before_);       \
        }                                                                              \
    } while (0)

static int check_summary(void) {
    printf("%d passed, %d failed\n", check_passed, check_failed);
    return check_failed == 0 ? 0 : 1;
}
#endif
