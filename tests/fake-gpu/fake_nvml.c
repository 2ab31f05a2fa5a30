/*
 * fake_nvml.c: a scriptable stand-in for libnvidia-ml.so, for tests on
 * machines without a GPU. It exports the NVML symbols memprobe uses, with the
 * real ABI, and answers from a small script (see README.md in this folder).
 *
 * Build: cc -shared -fPIC -Wall -Wextra -Werror -o libnvidia-ml.so.1 fake_nvml.c
 * Leave symbols out with -DFAKE_OMIT_<symbol>, e.g. -DFAKE_OMIT_nvmlShutdown.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
/* Helpers whose only callers can be left out with FAKE_OMIT_*. */
#define MAYBE_UNUSED __attribute__((unused))

typedef int nvmlReturn_t;
typedef struct fake_device *nvmlDevice_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

/* The layout of both nvmlProcessInfo_v2_t and nvmlProcessInfo_t (_v3 calls). */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_v2_t;

#define NVML_MEMORY_V2_VERSION ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999
};

static const struct {
    const char *name;
    int code;
} error_names[] = {
    {"SUCCESS", NVML_SUCCESS},
    {"UNINITIALIZED", NVML_ERROR_UNINITIALIZED},
    {"INVALID_ARGUMENT", NVML_ERROR_INVALID_ARGUMENT},
    {"NOT_SUPPORTED", NVML_ERROR_NOT_SUPPORTED},
    {"NO_PERMISSION", NVML_ERROR_NO_PERMISSION},
    {"ALREADY_INITIALIZED", NVML_ERROR_ALREADY_INITIALIZED},
    {"NOT_FOUND", NVML_ERROR_NOT_FOUND},
    {"INSUFFICIENT_SIZE", NVML_ERROR_INSUFFICIENT_SIZE},
    {"INSUFFICIENT_POWER", NVML_ERROR_INSUFFICIENT_POWER},
    {"DRIVER_NOT_LOADED", NVML_ERROR_DRIVER_NOT_LOADED},
    {"TIMEOUT", NVML_ERROR_TIMEOUT},
    {"IRQ_ISSUE", NVML_ERROR_IRQ_ISSUE},
    {"LIBRARY_NOT_FOUND", NVML_ERROR_LIBRARY_NOT_FOUND},
    {"FUNCTION_NOT_FOUND", NVML_ERROR_FUNCTION_NOT_FOUND},
    {"CORRUPTED_INFOROM", NVML_ERROR_CORRUPTED_INFOROM},
    {"GPU_IS_LOST", NVML_ERROR_GPU_IS_LOST},
    {"RESET_REQUIRED", NVML_ERROR_RESET_REQUIRED},
    {"OPERATING_SYSTEM", NVML_ERROR_OPERATING_SYSTEM},
    {"LIB_RM_VERSION_MISMATCH", NVML_ERROR_LIB_RM_VERSION_MISMATCH},
    {"IN_USE", NVML_ERROR_IN_USE},
    {"MEMORY", NVML_ERROR_MEMORY},
    {"NO_DATA", NVML_ERROR_NO_DATA},
    {"ARGUMENT_VERSION_MISMATCH", NVML_ERROR_ARGUMENT_VERSION_MISMATCH},
    {"UNKNOWN", NVML_ERROR_UNKNOWN},
};

#define MAX_DEVICES 32
#define MAX_STEPS 256
#define MAX_PROCS 64

struct proc {
    unsigned int pid;
    unsigned long long used;
    int children; /* stands for every child process of this one */
    int driver;   /* `used` is added to what the fake driver holds (BYTES `driver+N`) */
};

struct step {
    long long at_ms;
    unsigned long long used;
};

struct fake_device {
    int declared;
    int mig;
    char name[96];
    char uuid[96];
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long base_used;
    unsigned long long used[MAX_STEPS];
    int n_used;
    int used_pos;
    struct step timeline[MAX_STEPS];
    int n_timeline;
    long long period_ms;
    struct proc procs[MAX_PROCS];
    int n_procs;
    struct proc gprocs[MAX_PROCS];
    int n_gprocs;
    int lost;            /* lost from the start: even the handle query fails */
    int lost_at;         /* the memory query with this 1-based number, and all later calls, fail */
    int memory_calls;
    int memory_error;    /* both memory queries fail with this */
    int memory_v2_error; /* only the v2 memory query fails with this */
    int procs_error;
    int gprocs_error;
    int procs_insufficient; /* this many process queries with a buffer answer INSUFFICIENT_SIZE */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct fake_device devices[MAX_DEVICES];
static int n_devices = 1; /* declared device slots (physical and MIG) */
static int init_error = NVML_SUCCESS;
static int init_count;
#define INITED() __atomic_load_n(&init_count, __ATOMIC_ACQUIRE)
static char driver_version[80] = "555.42.06";
static long long spin_ns;
static long long init_delay_ms;
static long long start_ns;
static long long calls_memory_v1, calls_memory_v2;
static long long calls_procs_v1, calls_procs_v2, calls_procs_v3;
static long long calls_gprocs;
static long long calls_shutdown;

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Emulates the cost of a driver call (script: `spin_ns N`). */
MAYBE_UNUSED static void spin(void) {
    if (spin_ns > 0) {
        long long until = now_ns() + spin_ns;
        while (now_ns() < until) {
        }
    }
}

/* The outermost pid of this process that /proc shows (the host pid when visible). */
static unsigned int host_pid(void) {
    FILE *f = fopen("/proc/self/status", "r");
    unsigned int pid = (unsigned int)getpid();
    char line[512];
    if (!f) {
        return pid;
    }
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "NSpid:", 6) == 0) {
            unsigned int v;
            if (sscanf(line + 6, "%u", &v) == 1) {
                pid = v;
            }
            break;
        }
    }
    fclose(f);
    return pid;
}

static void set_defaults(int i) {
    struct fake_device *d = &devices[i];
    memset(d, 0, sizeof *d);
    snprintf(d->name, sizeof d->name, "Fake GPU %d", i);
    snprintf(d->uuid, sizeof d->uuid, "GPU-%x%07x-0000-4000-8000-%012x", (i + 1) % 16, i, i);
    d->total = 16ULL << 30;
    d->base_used = 1ULL << 30;
}

static int parse_error(const char *s, int *out) {
    char *end;
    long v;
    size_t i;
    for (i = 0; i < sizeof error_names / sizeof error_names[0]; i++) {
        if (strcmp(s, error_names[i].name) == 0) {
            *out = error_names[i].code;
            return 0;
        }
    }
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || *end || end == s) {
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int parse_u64(const char *s, unsigned long long *out) {
    char *end;
    errno = 0;
    *out = strtoull(s, &end, 0);
    return (errno || *end || end == s) ? -1 : 0;
}

static int parse_int(const char *s, int *out) {
    char *end;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || *end || end == s) {
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* PID:BYTES where PID is a number, `self` (getpid()), `hostself` (outermost
 * NSpid) or `children` (each child of this process, at query time), and
 * BYTES a number or `driver+N`: N plus what the fake driver (fake_cuda.c,
 * loaded in this process) holds on the device at query time. */
static int parse_proc(const char *s, struct proc *p) {
    char pid[64];
    const char *colon = strchr(s, ':');
    size_t n;
    if (!colon || (n = (size_t)(colon - s)) == 0 || n >= sizeof pid) {
        return -1;
    }
    memcpy(pid, s, n);
    pid[n] = 0;
    if (strcmp(pid, "self") == 0) {
        p->pid = (unsigned int)getpid();
    } else if (strcmp(pid, "hostself") == 0) {
        p->pid = host_pid();
    } else if (strcmp(pid, "children") == 0) {
        p->children = 1;
    } else {
        unsigned long long v;
        if (parse_u64(pid, &v)) {
            return -1;
        }
        p->pid = (unsigned int)v;
    }
    if (strncmp(colon + 1, "driver+", 7) == 0) {
        p->driver = 1;
        return parse_u64(colon + 8, &p->used);
    }
    return parse_u64(colon + 1, &p->used);
}

/* What the fake driver holds on device `index` (0 when it is not loaded). */
static unsigned long long driver_used(int index) {
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    unsigned long long (*used)(int) = NULL;
    unsigned long long v = 0;
    if (h) {
        *(void **)&used = dlsym(h, "fake_cuda_used");
        v = used ? used(index) : 0;
        dlclose(h);
    }
    return v;
}

static int parse_step(const char *s, struct step *st) {
    char at[64];
    const char *colon = strchr(s, ':');
    size_t n;
    unsigned long long v;
    if (!colon || (n = (size_t)(colon - s)) == 0 || n >= sizeof at) {
        return -1;
    }
    memcpy(at, s, n);
    at[n] = 0;
    if (parse_u64(at, &v)) {
        return -1;
    }
    st->at_ms = (long long)v;
    return parse_u64(colon + 1, &st->used);
}

static int device_line(struct fake_device *d, char *key, char **save) {
    char *tok;
    if (strcmp(key, "name") == 0) {
        char *rest = strtok_r(NULL, "\n", save);
        if (!rest) {
            return -1;
        }
        while (isspace((unsigned char)*rest)) {
            rest++;
        }
        snprintf(d->name, sizeof d->name, "%s", rest);
        return 0;
    }
    if (strcmp(key, "uuid") == 0) {
        if (!(tok = strtok_r(NULL, " \t\n", save))) {
            return -1;
        }
        snprintf(d->uuid, sizeof d->uuid, "%s", tok);
        return 0;
    }
    if (strcmp(key, "mig") == 0) {
        d->mig = 1;
        return 0;
    }
    if (strcmp(key, "lost") == 0) {
        d->lost = 1;
        return 0;
    }
    if (strcmp(key, "total") == 0 || strcmp(key, "reserved") == 0) {
        unsigned long long *dst = key[0] == 't' ? &d->total : &d->reserved;
        return (tok = strtok_r(NULL, " \t\n", save)) ? parse_u64(tok, dst) : -1;
    }
    if (strcmp(key, "used") == 0) {
        d->n_used = 0;
        while ((tok = strtok_r(NULL, " \t\n", save))) {
            if (d->n_used == MAX_STEPS || parse_u64(tok, &d->used[d->n_used++])) {
                return -1;
            }
        }
        return d->n_used ? 0 : -1;
    }
    if (strcmp(key, "timeline") == 0) {
        d->n_timeline = 0;
        while ((tok = strtok_r(NULL, " \t\n", save))) {
            if (d->n_timeline == MAX_STEPS || parse_step(tok, &d->timeline[d->n_timeline++])) {
                return -1;
            }
        }
        return d->n_timeline ? 0 : -1;
    }
    if (strcmp(key, "period_ms") == 0) {
        unsigned long long v;
        if (!(tok = strtok_r(NULL, " \t\n", save)) || parse_u64(tok, &v)) {
            return -1;
        }
        d->period_ms = (long long)v;
        return 0;
    }
    if (strcmp(key, "procs") == 0 || strcmp(key, "gprocs") == 0) {
        struct proc *list = key[0] == 'p' ? d->procs : d->gprocs;
        int *n = key[0] == 'p' ? &d->n_procs : &d->n_gprocs;
        *n = 0;
        while ((tok = strtok_r(NULL, " \t\n", save))) {
            if (*n == MAX_PROCS || parse_proc(tok, &list[(*n)++])) {
                return -1;
            }
        }
        return 0;
    }
    if (strcmp(key, "lost_at") == 0 || strcmp(key, "procs_insufficient") == 0) {
        int *dst = key[0] == 'l' ? &d->lost_at : &d->procs_insufficient;
        return (tok = strtok_r(NULL, " \t\n", save)) ? parse_int(tok, dst) : -1;
    }
    if (strcmp(key, "memory_error") == 0 || strcmp(key, "memory_v2_error") == 0 ||
        strcmp(key, "procs_error") == 0 || strcmp(key, "gprocs_error") == 0) {
        int *dst = strcmp(key, "memory_error") == 0      ? &d->memory_error
                   : strcmp(key, "memory_v2_error") == 0 ? &d->memory_v2_error
                   : strcmp(key, "procs_error") == 0     ? &d->procs_error
                                                         : &d->gprocs_error;
        return (tok = strtok_r(NULL, " \t\n", save)) ? parse_error(tok, dst) : -1;
    }
    return -1;
}

static int script_line(char *line) {
    char *save = NULL;
    char *key = strtok_r(line, " \t\n", &save);
    char *tok;
    if (!key || key[0] == '#') {
        return 0;
    }
    if (strcmp(key, "devices") == 0) {
        int n, i;
        if (!(tok = strtok_r(NULL, " \t\n", &save)) || parse_int(tok, &n) || n < 0 || n > MAX_DEVICES) {
            return -1;
        }
        n_devices = n;
        for (i = 0; i < n; i++) {
            if (!devices[i].declared) {
                set_defaults(i);
                devices[i].declared = 1;
            }
        }
        return 0;
    }
    if (strcmp(key, "device") == 0) {
        int i;
        if (!(tok = strtok_r(NULL, " \t\n", &save)) || parse_int(tok, &i) || i < 0 || i >= MAX_DEVICES) {
            return -1;
        }
        if (!devices[i].declared) {
            set_defaults(i);
            devices[i].declared = 1;
        }
        if (i >= n_devices) {
            n_devices = i + 1;
        }
        if (!(tok = strtok_r(NULL, " \t\n", &save))) {
            return -1;
        }
        return device_line(&devices[i], tok, &save);
    }
    if (strcmp(key, "init_error") == 0) {
        return (tok = strtok_r(NULL, " \t\n", &save)) ? parse_error(tok, &init_error) : -1;
    }
    if (strcmp(key, "driver_version") == 0) {
        if (!(tok = strtok_r(NULL, " \t\n", &save))) {
            return -1;
        }
        snprintf(driver_version, sizeof driver_version, "%s", tok);
        return 0;
    }
    if (strcmp(key, "init_delay_ms") == 0) {
        unsigned long long v;
        if (!(tok = strtok_r(NULL, " \t\n", &save)) || parse_u64(tok, &v)) {
            return -1;
        }
        init_delay_ms = (long long)v;
        return 0;
    }
    if (strcmp(key, "spin_ns") == 0) {
        unsigned long long v;
        if (!(tok = strtok_r(NULL, " \t\n", &save)) || parse_u64(tok, &v)) {
            return -1;
        }
        spin_ns = (long long)v;
        return 0;
    }
    return -1;
}

/* The script: $FAKE_NVML_SCRIPT, else fake_nvml.script next to this library. */
static int load_script(void) {
    char path[4096];
    const char *env = getenv("FAKE_NVML_SCRIPT");
    FILE *f;
    char line[4096];
    int lineno = 0;
    int i;

    for (i = 0; i < MAX_DEVICES; i++) {
        devices[i].declared = 0;
    }
    n_devices = 1;
    set_defaults(0);
    devices[0].declared = 1;
    init_error = NVML_SUCCESS;
    init_delay_ms = 0;

    if (env && *env) {
        snprintf(path, sizeof path, "%s", env);
    } else {
        Dl_info info;
        const char *slash;
        if (!dladdr((void *)&lock, &info) || !info.dli_fname) {
            return 0;
        }
        slash = strrchr(info.dli_fname, '/');
        if (slash) {
            snprintf(path, sizeof path, "%.*s/fake_nvml.script", (int)(slash - info.dli_fname), info.dli_fname);
        } else {
            snprintf(path, sizeof path, "fake_nvml.script");
        }
    }
    f = fopen(path, "r");
    if (!f) {
        return 0; /* no script: one default device */
    }
    while (fgets(line, sizeof line, f)) {
        char copy[4096];
        lineno++;
        snprintf(copy, sizeof copy, "%s", line);
        if (script_line(line)) {
            fprintf(stderr, "fake_nvml: %s:%d: cannot parse: %s", path, lineno, copy);
            fclose(f);
            return -1;
        }
    }
    fclose(f);
    return 0;
}

MAYBE_UNUSED static nvmlReturn_t do_init(void) {
    nvmlReturn_t rc;
    pthread_mutex_lock(&lock);
    if (init_count == 0) {
        if (load_script()) {
            pthread_mutex_unlock(&lock);
            return NVML_ERROR_UNKNOWN;
        }
        if (init_delay_ms > 0) {
            /* A slow driver initialisation (script: `init_delay_ms N`). */
            struct timespec ts;
            ts.tv_sec = (time_t)(init_delay_ms / 1000);
            ts.tv_nsec = (long)(init_delay_ms % 1000) * 1000000L;
            while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
            }
        }
        start_ns = now_ns();
    }
    rc = init_error;
    if (rc == NVML_SUCCESS) {
        __atomic_add_fetch(&init_count, 1, __ATOMIC_ACQ_REL);
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

#ifndef FAKE_OMIT_nvmlInit_v2
EXPORT nvmlReturn_t nvmlInit_v2(void) { return do_init(); }
#endif

#ifndef FAKE_OMIT_nvmlInitWithFlags
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return do_init();
}
#endif

#ifndef FAKE_OMIT_nvmlShutdown
EXPORT nvmlReturn_t nvmlShutdown(void) {
    nvmlReturn_t rc = NVML_SUCCESS;
    pthread_mutex_lock(&lock);
    calls_shutdown++;
    if (init_count == 0) {
        rc = NVML_ERROR_UNINITIALIZED;
    } else {
        __atomic_sub_fetch(&init_count, 1, __ATOMIC_ACQ_REL);
    }
    pthread_mutex_unlock(&lock);
    return rc;
}
#endif

#ifndef FAKE_OMIT_nvmlErrorString
EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    size_t i;
    for (i = 0; i < sizeof error_names / sizeof error_names[0]; i++) {
        if (error_names[i].code == result) {
            return error_names[i].name;
        }
    }
    return "UNKNOWN_ERROR_CODE";
}
#endif

MAYBE_UNUSED static nvmlReturn_t copy_string(const char *src, char *dst, unsigned int len) {
    if (!dst) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (strlen(src) + 1 > len) {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

#ifndef FAKE_OMIT_nvmlSystemGetDriverVersion
EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!INITED()) {
        return NVML_ERROR_UNINITIALIZED;
    }
    return copy_string(driver_version, version, length);
}
#endif

#ifndef FAKE_OMIT_nvmlSystemGetNVMLVersion
EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    if (!INITED()) {
        return NVML_ERROR_UNINITIALIZED;
    }
    return copy_string("12.555.42.06", version, length);
}
#endif

MAYBE_UNUSED static int enumerated_count(void) {
    int i, n = 0;
    for (i = 0; i < n_devices; i++) {
        n += devices[i].declared && !devices[i].mig;
    }
    return n;
}

#ifndef FAKE_OMIT_nvmlDeviceGetCount_v2
EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!INITED()) {
        return NVML_ERROR_UNINITIALIZED;
    }
    if (!count) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    pthread_mutex_lock(&lock);
    *count = (unsigned int)enumerated_count();
    pthread_mutex_unlock(&lock);
    return NVML_SUCCESS;
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetHandleByIndex_v2
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    int i, seen = 0;
    nvmlReturn_t rc = NVML_ERROR_INVALID_ARGUMENT;
    if (!INITED()) {
        return NVML_ERROR_UNINITIALIZED;
    }
    if (!device) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    pthread_mutex_lock(&lock);
    for (i = 0; i < n_devices; i++) {
        if (!devices[i].declared || devices[i].mig) {
            continue;
        }
        if ((unsigned int)seen++ == index) {
            if (devices[i].lost) {
                rc = NVML_ERROR_GPU_IS_LOST;
            } else {
                *device = &devices[i];
                rc = NVML_SUCCESS;
            }
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return rc;
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetHandleByUUID
EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    int i;
    nvmlReturn_t rc = NVML_ERROR_NOT_FOUND;
    if (!INITED()) {
        return NVML_ERROR_UNINITIALIZED;
    }
    if (!uuid || !device) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    pthread_mutex_lock(&lock);
    for (i = 0; i < n_devices; i++) {
        if (devices[i].declared && strcmp(devices[i].uuid, uuid) == 0) {
            if (devices[i].lost) {
                rc = NVML_ERROR_GPU_IS_LOST;
            } else {
                *device = &devices[i];
                rc = NVML_SUCCESS;
            }
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return rc;
}
#endif

static int valid_device(nvmlDevice_t d) {
    return d >= &devices[0] && d < &devices[MAX_DEVICES] && d->declared;
}

/* Checks shared by every per-device call; called with the lock held. */
static nvmlReturn_t device_check(nvmlDevice_t d) {
    if (!INITED()) {
        return NVML_ERROR_UNINITIALIZED;
    }
    if (!valid_device(d)) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (d->lost) {
        return NVML_ERROR_GPU_IS_LOST;
    }
    return NVML_SUCCESS;
}

#ifndef FAKE_OMIT_nvmlDeviceGetName
EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    nvmlReturn_t rc;
    pthread_mutex_lock(&lock);
    rc = device_check(device);
    if (rc == NVML_SUCCESS) {
        rc = copy_string(device->name, name, length);
    }
    pthread_mutex_unlock(&lock);
    return rc;
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetUUID
EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    nvmlReturn_t rc;
    pthread_mutex_lock(&lock);
    rc = device_check(device);
    if (rc == NVML_SUCCESS) {
        rc = copy_string(device->uuid, uuid, length);
    }
    pthread_mutex_unlock(&lock);
    return rc;
}
#endif

/* The scripted `used` (without the reservation) for this query; lock held. */
MAYBE_UNUSED static unsigned long long current_used(struct fake_device *d) {
    if (d->n_timeline) {
        long long ms = (now_ns() - start_ns) / 1000000LL;
        unsigned long long v = d->timeline[0].used;
        int i;
        if (d->period_ms > 0) {
            ms %= d->period_ms;
        }
        for (i = 0; i < d->n_timeline; i++) {
            if (d->timeline[i].at_ms <= ms) {
                v = d->timeline[i].used;
            }
        }
        return v;
    }
    if (d->n_used) {
        unsigned long long v = d->used[d->used_pos];
        if (d->used_pos + 1 < d->n_used) {
            d->used_pos++;
        }
        return v;
    }
    return d->base_used;
}

/* Counts a memory query and applies `lost_at` / `memory_error`; lock held. */
MAYBE_UNUSED static nvmlReturn_t memory_check(nvmlDevice_t d) {
    nvmlReturn_t rc = device_check(d);
    if (rc != NVML_SUCCESS) {
        return rc;
    }
    d->memory_calls++;
    if (d->lost_at > 0 && d->memory_calls >= d->lost_at) {
        d->lost = 1;
        return NVML_ERROR_GPU_IS_LOST;
    }
    return d->memory_error;
}

#ifndef FAKE_OMIT_nvmlDeviceGetMemoryInfo
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    nvmlReturn_t rc;
    spin();
    pthread_mutex_lock(&lock);
    calls_memory_v1++;
    rc = memory_check(device);
    if (rc == NVML_SUCCESS && !memory) {
        rc = NVML_ERROR_INVALID_ARGUMENT;
    }
    if (rc == NVML_SUCCESS) {
        /* v1: `used` includes the driver's reservation. */
        unsigned long long used = current_used(device) + device->reserved;
        memory->total = device->total;
        memory->used = used;
        memory->free = device->total > used ? device->total - used : 0;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetMemoryInfo_v2
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    nvmlReturn_t rc;
    spin();
    pthread_mutex_lock(&lock);
    calls_memory_v2++;
    rc = memory_check(device);
    if (rc == NVML_SUCCESS && !memory) {
        rc = NVML_ERROR_INVALID_ARGUMENT;
    }
    if (rc == NVML_SUCCESS && memory->version != NVML_MEMORY_V2_VERSION) {
        rc = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    }
    if (rc == NVML_SUCCESS && device->memory_v2_error) {
        rc = device->memory_v2_error;
    }
    if (rc == NVML_SUCCESS) {
        unsigned long long used = current_used(device);
        unsigned long long taken = used + device->reserved;
        memory->total = device->total;
        memory->reserved = device->reserved;
        memory->used = used;
        memory->free = device->total > taken ? device->total - taken : 0;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}
#endif

/* Expands `children` entries of `list` into `out` (the children of this
 * process found in /proc, each with the entry's bytes); returns the count. */
static unsigned int expand(const struct proc *list, unsigned int n, struct proc *out, int index) {
    unsigned int i, k = 0;
    for (i = 0; i < n && k < MAX_PROCS; i++) {
        DIR *dir;
        struct dirent *e;
        if (!list[i].children) {
            out[k] = list[i];
            if (list[i].driver) out[k].used += driver_used(index);
            k++;
            continue;
        }
        dir = opendir("/proc");
        while (dir && (e = readdir(dir)) != NULL && k < MAX_PROCS) {
            char path[300], buf[512];
            const char *rp;
            FILE *f;
            int ppid = -1;
            if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
            snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
            f = fopen(path, "r");
            if (!f) continue;
            if (fgets(buf, sizeof buf, f) && (rp = strrchr(buf, ')')) != NULL) sscanf(rp + 1, " %*c %d", &ppid);
            fclose(f);
            if (ppid == (int)getpid()) {
                out[k].pid = (unsigned int)strtoul(e->d_name, NULL, 10);
                out[k].used = list[i].used;
                out[k].children = 0;
                k++;
            }
        }
        if (dir) closedir(dir);
    }
    return k;
}

/* One process-list query; `v` is 1, 2 or 3 (the entry layout), lock taken here. */
MAYBE_UNUSED static nvmlReturn_t processes(nvmlDevice_t d, unsigned int *count, void *infos, int v, int graphics) {
    nvmlReturn_t rc;
    struct proc list[MAX_PROCS];
    unsigned int n, i;
    pthread_mutex_lock(&lock);
    if (graphics) {
        calls_gprocs++;
    } else if (v == 1) {
        calls_procs_v1++;
    } else if (v == 2) {
        calls_procs_v2++;
    } else {
        calls_procs_v3++;
    }
    rc = device_check(d);
    if (rc == NVML_SUCCESS && !count) {
        rc = NVML_ERROR_INVALID_ARGUMENT;
    }
    if (rc == NVML_SUCCESS) {
        rc = graphics ? d->gprocs_error : d->procs_error;
    }
    if (rc != NVML_SUCCESS) {
        pthread_mutex_unlock(&lock);
        return rc;
    }
    n = expand(graphics ? d->gprocs : d->procs, (unsigned int)(graphics ? d->n_gprocs : d->n_procs), list,
               (int)(d - devices));
    if (!graphics && infos && d->procs_insufficient > 0) {
        /* As if a process started between the size query and this one. */
        d->procs_insufficient--;
        *count = n + 1;
        pthread_mutex_unlock(&lock);
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (*count < n || (n && !infos)) {
        *count = n;
        pthread_mutex_unlock(&lock);
        return n ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    }
    for (i = 0; i < n; i++) {
        if (v == 1) {
            nvmlProcessInfo_v1_t *p = (nvmlProcessInfo_v1_t *)infos + i;
            p->pid = list[i].pid;
            p->usedGpuMemory = list[i].used;
        } else {
            nvmlProcessInfo_v2_t *p = (nvmlProcessInfo_v2_t *)infos + i;
            p->pid = list[i].pid;
            p->usedGpuMemory = list[i].used;
            p->gpuInstanceId = 0xFFFFFFFFu;
            p->computeInstanceId = 0xFFFFFFFFu;
        }
    }
    *count = n;
    pthread_mutex_unlock(&lock);
    return NVML_SUCCESS;
}

#ifndef FAKE_OMIT_nvmlDeviceGetComputeRunningProcesses
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *count,
                                                         nvmlProcessInfo_v1_t *infos) {
    return processes(device, count, infos, 1, 0);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetComputeRunningProcesses_v2
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *count,
                                                            nvmlProcessInfo_v2_t *infos) {
    return processes(device, count, infos, 2, 0);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetComputeRunningProcesses_v3
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                            nvmlProcessInfo_v2_t *infos) {
    return processes(device, count, infos, 3, 0);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetGraphicsRunningProcesses
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device, unsigned int *count,
                                                          nvmlProcessInfo_v1_t *infos) {
    return processes(device, count, infos, 1, 1);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetGraphicsRunningProcesses_v2
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int *count,
                                                             nvmlProcessInfo_v2_t *infos) {
    return processes(device, count, infos, 2, 1);
}
#endif

#ifndef FAKE_OMIT_nvmlDeviceGetGraphicsRunningProcesses_v3
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                             nvmlProcessInfo_v2_t *infos) {
    return processes(device, count, infos, 3, 1);
}
#endif

/*
 * Test hook (not NVML): how many times a call was made. `what` is one of
 * memory_v1, memory_v2, procs_v1, procs_v2, procs_v3, gprocs, shutdown.
 */
EXPORT long long fake_nvml_calls(const char *what) {
    long long v = -1;
    pthread_mutex_lock(&lock);
    if (strcmp(what, "memory_v1") == 0) {
        v = calls_memory_v1;
    } else if (strcmp(what, "memory_v2") == 0) {
        v = calls_memory_v2;
    } else if (strcmp(what, "procs_v1") == 0) {
        v = calls_procs_v1;
    } else if (strcmp(what, "procs_v2") == 0) {
        v = calls_procs_v2;
    } else if (strcmp(what, "procs_v3") == 0) {
        v = calls_procs_v3;
    } else if (strcmp(what, "gprocs") == 0) {
        v = calls_gprocs;
    } else if (strcmp(what, "shutdown") == 0) {
        v = calls_shutdown;
    }
    pthread_mutex_unlock(&lock);
    return v;
}
