/* Log collector: every shipped line is strdup'd onto a global "recent lines" list. Variants: leak (list never trimmed) | bounded (keeps the last 256 lines). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TICKS 100
#define LINES_PER_TICK 48

struct line {
    struct line *next;
    char *text;
};

static struct line *recent_head, *recent_tail;
static size_t recent_count;
static size_t keep_limit; /* 0: keep everything */

static void remember(const char *text)
{
    struct line *l = malloc(sizeof *l);
    if (!l)
        abort();
    l->text = strdup(text); /* LEAK-SITE */
    l->next = NULL;
    if (recent_tail)
        recent_tail->next = l;
    else
        recent_head = l;
    recent_tail = l;
    recent_count++;
    while (keep_limit && recent_count > keep_limit) {
        struct line *old = recent_head;
        recent_head = old->next;
        if (!recent_head)
            recent_tail = NULL;
        free(old->text);
        free(old);
        recent_count--;
    }
}

/* A request log line: a header and a dump of the request it describes (~2 KiB). */
static size_t format_line(char *buf, size_t cap, const char *body, unsigned seq)
{
    int n = snprintf(buf, cap, "2024-05-01T12:%02u:%02u.%03uZ INFO [worker-%u] req=%u status=200 body=",
                     seq / 60000 % 60, seq / 1000 % 60, seq % 1000, seq % 4, seq);
    size_t len = 1600 + (seq * 37) % 800;
    if (len > cap - n - 1)
        len = cap - n - 1;
    memcpy(buf + n, body + seq % 64, len);
    buf[n + len] = '\0';
    return n + len;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "leak";
    if (!strcmp(mode, "bounded"))
        keep_limit = 256;
    else if (strcmp(mode, "leak")) {
        fprintf(stderr, "usage: %s leak|bounded\n", argv[0]);
        return 2;
    }
    static char body[4096], buf[4096];
    for (size_t i = 0; i < sizeof body; i++)
        body[i] = "abcdefghijklmnopqrstuvwxyz0123456789&=%"[i % 39];
    FILE *sink = fopen("/dev/null", "w");
    if (!sink)
        return 1;
    unsigned seq = 0;
    size_t shipped = 0;
    for (int tick = 0; tick < TICKS; tick++) {
        for (int i = 0; i < LINES_PER_TICK; i++, seq++) {
            size_t n = format_line(buf, sizeof buf, body, seq);
            fwrite(buf, 1, n, sink);
            shipped += n;
            remember(buf);
        }
        usleep(20000);
    }
    fclose(sink);
    printf("shipped %zu bytes in %u lines, %zu kept\n", shipped, seq, recent_count);
    return 0;
}
