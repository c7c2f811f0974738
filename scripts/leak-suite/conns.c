/* Connection manager: conn_close() frees the struct but forgets its 48 KiB receive buffer. Variants: leak | fixed (buffer freed) | spike (fixed + a burst of 640 connections, 30 MiB, every 25 ticks). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TICKS 100
#define RBUF_SIZE (48 * 1024)
#define LIVE 8

struct conn {
    unsigned id;
    size_t used;
    char *rbuf;
};

static int close_frees_buffer;
static unsigned long bytes_in;

static struct conn *conn_open(unsigned id)
{
    struct conn *c = calloc(1, sizeof *c);
    if (!c)
        abort();
    c->id = id;
    c->rbuf = malloc(RBUF_SIZE); /* LEAK-SITE */
    if (!c->rbuf)
        abort();
    return c;
}

static void conn_recv(struct conn *c, const char *data, size_t n)
{
    if (n > RBUF_SIZE - c->used)
        n = RBUF_SIZE - c->used;
    memcpy(c->rbuf + c->used, data, n);
    c->used += n;
    bytes_in += n;
}

static void conn_close(struct conn *c)
{
    if (close_frees_buffer)
        free(c->rbuf);
    free(c);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "leak";
    int spike = !strcmp(mode, "spike");
    if (spike || !strcmp(mode, "fixed"))
        close_frees_buffer = 1;
    else if (strcmp(mode, "leak")) {
        fprintf(stderr, "usage: %s leak|fixed|spike\n", argv[0]);
        return 2;
    }
    static char request[RBUF_SIZE];
    int n = snprintf(request, sizeof request, "POST /upload HTTP/1.1\r\nContent-Length: %d\r\n\r\n",
                     RBUF_SIZE - 64);
    memset(request + n, 'u', sizeof request - n);
    struct conn *live[LIVE] = {0};
    unsigned next_id = 0;
    for (int tick = 0; tick < TICKS; tick++) {
        if (spike && tick % 25 == 12) { /* a client reconnect storm */
            static struct conn *burst[640];
            for (int i = 0; i < 640; i++) {
                burst[i] = conn_open(next_id++);
                conn_recv(burst[i], request, sizeof request);
            }
            usleep(20000);
            for (int i = 0; i < 640; i++)
                conn_close(burst[i]);
        }
        for (int i = 0; i < 2; i++) {
            struct conn **slot = &live[next_id % LIVE];
            if (*slot)
                conn_close(*slot);
            *slot = conn_open(next_id++);
            conn_recv(*slot, request, sizeof request);
        }
        usleep(20000);
    }
    for (int i = 0; i < LIVE; i++)
        if (live[i])
            conn_close(live[i]);
    printf("%u connections, %lu bytes received\n", next_id, bytes_in);
    return 0;
}
