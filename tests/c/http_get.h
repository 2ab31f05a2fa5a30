/* GET `path` from 127.0.0.1:port with the extra `headers` (each ending in
 * \r\n; "" for none); the whole answer into buf, NUL-terminated. Returns
 * its length, or -1 when nothing could be sent (nothing listening). */
#ifndef MEMPROBE_HTTP_GET_H
#define MEMPROBE_HTTP_GET_H
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int http_get(uint16_t port, const char *path, const char *headers, char *buf, size_t len) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    char req[512];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\n%s\r\n", path, headers);
    if (n < 0 || (size_t)n >= sizeof req || write(fd, req, (size_t)n) != n) {
        close(fd);
        return -1;
    }
    size_t got = 0;
    ssize_t r;
    while (got + 1 < len && (r = read(fd, buf + got, len - 1 - got)) > 0) got += (size_t)r;
    buf[got] = 0;
    close(fd);
    return (int)got;
}
#endif
