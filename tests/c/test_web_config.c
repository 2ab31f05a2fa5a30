/* The exporter behind a web configuration from C: basic auth on a real
 * socket, the file re-read while serving and a broken one reported through
 * memprobe_exporter_get_web_config_error (the library prints nothing),
 * errors at start (missing file, unknown key), NULLs, invalid handles,
 * short buffers, wrong order. TLS is tested from Rust (it needs
 * certificates and a TLS client). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "http_get.h"

/* bcrypt (cost 4) of "s3cret"; "dXNlcjpzM2NyZXQ=" is base64 of "user:s3cret". */
#define HASH "$2b$04$DLse4tY1yMwulgkiUjPoOuY7.3QEz2D0lKkl1cubv8IH8v4FRjdf2"
#define GOOD "Authorization: Basic dXNlcjpzM2NyZXQ=\r\n"

/* Replaces `path` whole (write a temporary file, rename it over). */
static void write_file(const char *path, const char *text) {
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
    CHECK(rename(tmp, path) == 0);
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static char page[1 << 16];

int main(void) {
    char dir[] = "/tmp/memprobe-web-c-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char file[256], missing[256];
    snprintf(file, sizeof file, "%s/web.yml", dir);
    snprintf(missing, sizeof missing, "%s/absent.yml", dir);
    write_file(file, "basic_auth_users:\n  user: '" HASH "'\n");

    memprobe_exporter *e = NULL;
    memprobe_status err = MEMPROBE_STATUS_INTERNAL;
    char msg[256];
    size_t needed = 0;
    uint16_t port = 0;

    /* NULLs. */
    EXPECT(memprobe_exporter_start_with_web_config(NULL, NULL, &e), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_exporter_start_with_web_config(NULL, file, NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_exporter_get_web_config_error(NULL, &err, msg, sizeof msg, &needed),
           MEMPROBE_STATUS_NULL_POINTER);
    /* A malformed address, a missing file, an unknown key: no exporter. */
    EXPECT(memprobe_exporter_start_with_web_config("localhost", file, &e), MEMPROBE_STATUS_INVALID_ARGUMENT);
    EXPECT(memprobe_exporter_start_with_web_config(NULL, missing, &e), MEMPROBE_STATUS_UNAVAILABLE);
    CHECK(strstr(memprobe_last_error(), "absent.yml") != NULL);
    {
        char bad[256];
        snprintf(bad, sizeof bad, "%s/bad.yml", dir);
        write_file(bad, "basic_auth_users: {}\ntls_config: {}\n");
        EXPECT(memprobe_exporter_start_with_web_config(NULL, bad, &e), MEMPROBE_STATUS_PARSE);
        CHECK(strstr(memprobe_last_error(), "tls_config") != NULL);
        unlink(bad);
    }
    CHECK(e == NULL);

    OK(memprobe_exporter_start_with_web_config("127.0.0.1:0", file, &e));
    OK(memprobe_exporter_port(e, &port));
    EXPECT(memprobe_exporter_get_web_config_error(e, NULL, msg, sizeof msg, &needed),
           MEMPROBE_STATUS_NULL_POINTER);
    /* Another type's handle. */
    {
        memprobe_source *s = NULL;
        OK(memprobe_source_new_pushed("x", &s));
        EXPECT(memprobe_exporter_get_web_config_error((memprobe_exporter *)s, &err, msg, sizeof msg, NULL),
               MEMPROBE_STATUS_INVALID_HANDLE);
        FREE_OK(memprobe_source_free(s));
    }
    OK(memprobe_exporter_get_web_config_error(e, &err, msg, sizeof msg, &needed));
    CHECK(err == MEMPROBE_STATUS_OK && msg[0] == 0 && needed == 1);

    /* The password is asked, and the right one served. */
    CHECK(http_get(port, "/metrics", "", page, sizeof page) > 0);
    CHECK(strstr(page, "HTTP/1.1 401 ") == page);
    CHECK(strstr(page, "WWW-Authenticate: Basic") != NULL);
    CHECK(http_get(port, "/metrics", "Authorization: Basic dXNlcjp3cm9uZw==\r\n", page, sizeof page) > 0);
    CHECK(strstr(page, "HTTP/1.1 401 ") == page);
    CHECK(http_get(port, "/metrics", GOOD, page, sizeof page) > 0);
    CHECK(strstr(page, "HTTP/1.1 200 OK") == page);

    /* A broken file while serving: refused, said through the getter, the
     * last good one still served. */
    write_file(file, "basic_auth_users:\n  user: '" HASH "'\nbasic_auth_userz: {}\n");
    for (int i = 0; i < 200; i++) {
        OK(memprobe_exporter_get_web_config_error(e, &err, msg, sizeof msg, &needed));
        if (err != MEMPROBE_STATUS_OK) break;
        sleep_ms(50);
    }
    CHECK(err == MEMPROBE_STATUS_PARSE);
    CHECK(strstr(msg, "basic_auth_userz") != NULL);
    CHECK(needed == strlen(msg) + 1);
    {
        char small[4];
        EXPECT(memprobe_exporter_get_web_config_error(e, &err, small, sizeof small, &needed),
               MEMPROBE_STATUS_BUFFER_TOO_SMALL);
        CHECK(strlen(small) == 3 && needed > sizeof small);
        /* The size alone. */
        OK(memprobe_exporter_get_web_config_error(e, &err, NULL, 0, &needed));
    }
    CHECK(http_get(port, "/metrics", GOOD, page, sizeof page) > 0);
    CHECK(strstr(page, "HTTP/1.1 200 OK") == page);

    /* Fixed, with no users: taken, the error clears, no password asked. */
    write_file(file, "basic_auth_users: {}\n");
    for (int i = 0; i < 200; i++) {
        OK(memprobe_exporter_get_web_config_error(e, &err, msg, sizeof msg, &needed));
        if (err == MEMPROBE_STATUS_OK) break;
        sleep_ms(50);
    }
    CHECK(err == MEMPROBE_STATUS_OK && msg[0] == 0);
    for (int i = 0; i < 200; i++) {
        CHECK(http_get(port, "/metrics", "", page, sizeof page) > 0);
        if (strstr(page, "HTTP/1.1 200 OK") == page) break;
        sleep_ms(50);
    }
    CHECK(strstr(page, "HTTP/1.1 200 OK") == page);

    /* Wrong order: after stop there is nothing to report; after free the
     * handle is stale. */
    OK(memprobe_exporter_stop(e));
    OK(memprobe_exporter_get_web_config_error(e, &err, msg, sizeof msg, &needed));
    CHECK(err == MEMPROBE_STATUS_OK && msg[0] == 0);
    FREE_OK(memprobe_exporter_free(e));
    EXPECT(memprobe_exporter_get_web_config_error(e, &err, msg, sizeof msg, &needed),
           MEMPROBE_STATUS_INVALID_HANDLE);

    /* An exporter without a web configuration: nothing to report. */
    OK(memprobe_exporter_start(NULL, &e));
    OK(memprobe_exporter_get_web_config_error(e, &err, msg, sizeof msg, &needed));
    CHECK(err == MEMPROBE_STATUS_OK && msg[0] == 0);
    FREE_OK(memprobe_exporter_free(e));

    unlink(file);
    rmdir(dir);
    return check_summary();
}
