/* Response cache: a hash table keyed by (unique) request id. Variants: leak (no eviction) | bounded (64 entries, oldest evicted) | spike (bounded + 40 MiB prefetch cached then flushed every 25 ticks). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BUCKETS 1024
#define TICKS 100
#define REQS_PER_TICK 4
#define BODY_SIZE (24 * 1024)

struct entry {
    struct entry *next;
    uint64_t key;
    size_t len;
    char *body;
};

static struct entry *table[BUCKETS];
static uint64_t order[4096]; /* insertion order, for eviction */
static size_t order_head, order_len, max_entries;

static struct entry *lookup(uint64_t key)
{
    for (struct entry *e = table[key % BUCKETS]; e; e = e->next)
        if (e->key == key)
            return e;
    return NULL;
}

static void evict(uint64_t key)
{
    for (struct entry **p = &table[key % BUCKETS]; *p; p = &(*p)->next)
        if ((*p)->key == key) {
            struct entry *e = *p;
            *p = e->next;
            free(e->body);
            free(e);
            return;
        }
}

static void insert(uint64_t key, const char *body, size_t len)
{
    struct entry *e = malloc(sizeof *e);
    e->body = malloc(len); /* LEAK-SITE */
    memcpy(e->body, body, len);
    e->key = key;
    e->len = len;
    e->next = table[key % BUCKETS];
    table[key % BUCKETS] = e;
    if (max_entries) {
        order[(order_head + order_len++) % 4096] = key;
        for (; order_len > max_entries; order_len--, order_head = (order_head + 1) % 4096)
            evict(order[order_head]);
    }
}

static char items[64 * 1024 + 32];

static void render(char *out, size_t len, uint64_t key)
{
    if (!items[0])
        for (size_t i = 0; i < sizeof items; i++)
            items[i] = "{\"id\":1,\"v\":\"abc\"},"[i % 19];
    int n = snprintf(out, len, "{\"request\":%llu,\"items\":[", (unsigned long long)key);
    memcpy(out + n, items + key % 19, len - n);
}

static void flush_all(void)
{
    for (int b = 0; b < BUCKETS; b++)
        while (table[b])
            evict(table[b]->key);
    order_head = order_len = 0;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "leak";
    int spike = !strcmp(mode, "spike");
    if (spike || !strcmp(mode, "bounded"))
        max_entries = 64;
    else if (strcmp(mode, "leak")) {
        fprintf(stderr, "usage: %s leak|bounded|spike\n", argv[0]);
        return 2;
    }
    static char body[64 * 1024];
    uint64_t next_id = 1;
    unsigned long hits = 0, misses = 0;
    for (int tick = 0; tick < TICKS; tick++) {
        if (spike && tick % 25 == 12) {
            size_t keep = max_entries;
            max_entries = 0; /* the prefetch batch is cached whole, then dropped */
            for (int i = 0; i < 640; i++) {
                render(body, sizeof body, 1000000 + i);
                insert(1000000 + i, body, sizeof body);
            }
            usleep(20000);
            flush_all();
            max_entries = keep;
        }
        for (int i = 0; i < REQS_PER_TICK; i++) {
            uint64_t id = next_id++;
            if (lookup(id)) {
                hits++;
                continue;
            }
            misses++;
            render(body, BODY_SIZE, id);
            insert(id, body, BODY_SIZE);
        }
        usleep(20000);
    }
    printf("%lu hits, %lu misses\n", hits, misses);
    return 0;
}
