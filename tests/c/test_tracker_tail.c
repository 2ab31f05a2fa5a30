/* A tracker's tails through the C ABI, on a pushed (scripted) source: a
 * step ended into its tail and resumed begins at that end (one boundary
 * per step, the gap between two steps in the second); another phase can
 * take a tail; bad input (NULL, forged handles, unknown kinds, names where
 * none belong) and wrong orders change nothing. */
#include <stdint.h>
#include "check.h"

#define STEP MEMPROBE_PHASE_KIND_STEP
#define EPOCH MEMPROBE_PHASE_KIND_EPOCH
#define CUSTOM MEMPROBE_PHASE_KIND_CUSTOM

int main(void) {
    memprobe_source *src = NULL;
    memprobe_tracker *t = NULL;
    memprobe_phase_record rec, rec2;
    memprobe_delta d[1];
    const memprobe_source *list[1];

    OK(memprobe_source_new_pushed("used", &src));
    OK(memprobe_source_push(src, 100));
    list[0] = src;
    OK(memprobe_tracker_new(list, 1, &t));

    /* Two steps, one boundary between them: the gap is the second's. */
    OK(memprobe_tracker_begin(t, EPOCH, NULL));
    OK(memprobe_tracker_begin(t, STEP, NULL));
    OK(memprobe_tracker_end_into(t, STEP, NULL, STEP, NULL, &rec, d, 1));
    CHECK(rec.index == 0 && rec.depth == 1 && d[0].peak == 100);
    OK(memprobe_source_push(src, 400)); /* between the steps */
    OK(memprobe_source_push(src, 150));
    OK(memprobe_tracker_resume(t, STEP, NULL, STEP, NULL));
    OK(memprobe_tracker_end_into(t, STEP, NULL, STEP, NULL, &rec2, d, 1));
    CHECK(rec2.index == 1 && rec2.started_at_ns == rec.ended_at_ns);
    CHECK(d[0].used_start == 100 && d[0].peak == 400 && d[0].used_end == 150);

    /* An evaluation that took the step's tail; the next step begins at its end. */
    OK(memprobe_tracker_resume(t, CUSTOM, "eval", STEP, NULL));
    OK(memprobe_tracker_end_into(t, CUSTOM, "eval", STEP, NULL, &rec, d, 1));
    CHECK(rec.kind == CUSTOM && strcmp(rec.name, "eval") == 0 && rec.started_at_ns == rec2.ended_at_ns);
    OK(memprobe_tracker_end(t, EPOCH, NULL, &rec, NULL, 0));
    CHECK(rec.depth == 0);

    /* A step that began on its tail, ended in one call. */
    OK(memprobe_tracker_begin(t, EPOCH, NULL));
    OK(memprobe_tracker_mark_tail(t, STEP, NULL));
    OK(memprobe_source_push(src, 333));
    OK(memprobe_tracker_end_tail(t, STEP, NULL, STEP, NULL, &rec, d, 1));
    CHECK(rec.kind == STEP && rec.depth == 1 && d[0].peak == 333);
    OK(memprobe_tracker_end_tail(t, STEP, NULL, STEP, NULL, &rec2, NULL, 0));
    CHECK(rec2.index == rec.index + 1 && rec2.started_at_ns == rec.ended_at_ns);
    EXPECT(memprobe_tracker_end_tail(t, EPOCH, NULL, EPOCH, NULL, NULL, NULL, 0), MEMPROBE_STATUS_WRONG_ORDER);
    EXPECT(memprobe_tracker_end_tail(NULL, STEP, NULL, STEP, NULL, NULL, NULL, 0), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_tracker_end_tail(t, 77, NULL, STEP, NULL, NULL, NULL, 0), MEMPROBE_STATUS_INVALID_ARGUMENT);
    EXPECT(memprobe_tracker_end_tail((memprobe_tracker *)src, STEP, NULL, STEP, NULL, NULL, NULL, 0),
           MEMPROBE_STATUS_INVALID_HANDLE);
    OK(memprobe_tracker_end(t, EPOCH, NULL, NULL, NULL, 0));

    /* A tail started now, with no phase. */
    OK(memprobe_tracker_mark_tail(t, STEP, NULL));
    OK(memprobe_tracker_mark_tail(t, CUSTOM, "warmup"));

    /* NULL handles and outputs, forged handles. */
    EXPECT(memprobe_tracker_end_into(NULL, STEP, NULL, STEP, NULL, NULL, NULL, 0), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_tracker_resume(NULL, STEP, NULL, STEP, NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_tracker_mark_tail(NULL, STEP, NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_tracker_resume((memprobe_tracker *)(uintptr_t)77, STEP, NULL, STEP, NULL),
           MEMPROBE_STATUS_INVALID_HANDLE);
    EXPECT(memprobe_tracker_mark_tail((memprobe_tracker *)src, STEP, NULL), MEMPROBE_STATUS_INVALID_HANDLE);

    /* Unknown kinds, names where none belong, custom phases without one. */
    EXPECT(memprobe_tracker_resume(t, 99, NULL, STEP, NULL), MEMPROBE_STATUS_INVALID_ARGUMENT);
    EXPECT(memprobe_tracker_resume(t, STEP, NULL, 1234567, NULL), MEMPROBE_STATUS_INVALID_ARGUMENT);
    EXPECT(memprobe_tracker_mark_tail(t, 7, NULL), MEMPROBE_STATUS_INVALID_ARGUMENT);
    EXPECT(memprobe_tracker_mark_tail(t, CUSTOM, NULL), MEMPROBE_STATUS_INVALID_ARGUMENT);
    EXPECT(memprobe_tracker_resume(t, STEP, "named", STEP, NULL), MEMPROBE_STATUS_INVALID_ARGUMENT);

    /* Wrong orders: nothing open to end; an epoch inside a step. */
    EXPECT(memprobe_tracker_end_into(t, STEP, NULL, STEP, NULL, &rec, d, 1), MEMPROBE_STATUS_WRONG_ORDER);
    OK(memprobe_tracker_begin(t, EPOCH, NULL));
    OK(memprobe_tracker_resume(t, STEP, NULL, STEP, NULL));
    EXPECT(memprobe_tracker_resume(t, EPOCH, NULL, CUSTOM, "warmup"), MEMPROBE_STATUS_WRONG_ORDER);
    EXPECT(memprobe_tracker_end_into(t, EPOCH, NULL, STEP, NULL, NULL, NULL, 0), MEMPROBE_STATUS_WRONG_ORDER);
    EXPECT(memprobe_tracker_end_into(t, STEP, NULL, 42, NULL, NULL, NULL, 0), MEMPROBE_STATUS_INVALID_ARGUMENT);
    /* The step is still open after every refusal. */
    OK(memprobe_tracker_end_into(t, STEP, NULL, STEP, NULL, &rec, NULL, 0));
    CHECK(rec.index == 4);
    OK(memprobe_tracker_end(t, EPOCH, NULL, NULL, NULL, 0));

    FREE_OK(memprobe_tracker_free(t));
    EXPECT(memprobe_tracker_mark_tail(t, STEP, NULL), MEMPROBE_STATUS_INVALID_HANDLE);
    FREE_OK(memprobe_source_free(src));
    return check_summary();
}
