/* A small HTTP/1.1 keep-alive server for bench/http.py: one thread, epoll, a fixed
 * 200 response to every request (read(), then write(): two syscalls per request, the
 * pair the agent's socket probes cost on a server).
 *
 *   http_server PORT [WORK_US]
 *
 * WORK_US (default 0) spins about that many microseconds of CPU per request before
 * answering: a stand-in for a handler that does something, so the probes' fixed
 * cost per syscall can be read against requests of different weights. */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static const char RESPONSE[] =
    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 13\r\n\r\nhello, world\n";

static long work_ns;
static unsigned long spins_per_request;
static volatile unsigned long sink;

static long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

/* A fixed count of loop iterations, calibrated once at start: CPU work, with no
 * syscall in it (a traced host takes a slower path on every syscall). */
static void handle(void)
{
    for (unsigned long i = 0; i < spins_per_request; i++)
        sink += i;
}

static void calibrate(void)
{
    if (!work_ns)
        return;
    unsigned long n = 20000000;
    long t0 = now_ns();
    for (unsigned long i = 0; i < n; i++)
        sink += i;
    long took = now_ns() - t0;
    spins_per_request = (unsigned long)((double)n * work_ns / (took > 0 ? took : 1));
}

struct conn {
    int fd;
    size_t used;
    char buf[8192];
};

static void serve(struct conn *c)
{
    for (;;) {
        ssize_t n = read(c->fd, c->buf + c->used, sizeof(c->buf) - c->used);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
            close(c->fd);
            free(c);
            return;
        }
        if (n < 0)
            return;
        c->used += (size_t)n;
        char *start = c->buf, *end;
        while ((end = memmem(start, c->buf + c->used - start, "\r\n\r\n", 4)) != NULL) {
            handle();
            if (write(c->fd, RESPONSE, sizeof(RESPONSE) - 1) < 0) {
                close(c->fd);
                free(c);
                return;
            }
            start = end + 4;
        }
        c->used -= (size_t)(start - c->buf);
        memmove(c->buf, start, c->used);
        if (c->used == sizeof(c->buf))
            c->used = 0; /* a request head larger than the buffer: drop it */
    }
}

int main(int argc, char **argv)
{
    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: %s PORT [WORK_US]\n", argv[0]);
        return 2;
    }
    if (argc == 3)
        work_ns = atol(argv[2]) * 1000L;
    calibrate();
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(argv[1])),
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(lfd, (struct sockaddr *)&addr, sizeof(addr)) || listen(lfd, 1024)) {
        perror("bind/listen");
        return 1;
    }
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
    printf("ready\n");
    fflush(stdout);
    struct epoll_event events[256];
    for (;;) {
        int n = epoll_wait(ep, events, 256, -1);
        for (int i = 0; i < n; i++) {
            if (events[i].data.ptr == NULL) {
                int fd;
                while ((fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    struct conn *c = calloc(1, sizeof(*c));
                    c->fd = fd;
                    struct epoll_event cev = {.events = EPOLLIN, .data.ptr = c};
                    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &cev);
                }
            } else {
                serve(events[i].data.ptr);
            }
        }
    }
}
