/* A small HTTP/1.1 keep-alive server for bench/http.py: one thread, epoll, a fixed
 * 200 response to every request (read(), then write(): two syscalls per request, the
 * pair the agent's socket probes cost on a server).
 *
 *   http_server PORT */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

static const char RESPONSE[] =
    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 13\r\n\r\nhello, world\n";

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
    if (argc != 2) {
        fprintf(stderr, "usage: %s PORT\n", argv[0]);
        return 2;
    }
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
