/* Inventory table grown with realloc: an update overwrites a record's description with a fresh copy. Variants: leak (old copy never freed) | fixed (freed first). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CATALOGUE 512
#define TICKS 100
#define UPDATES_PER_TICK 24

struct record {
    unsigned sku;
    unsigned qty;
    char *desc;
};

static struct record *recs;
static size_t nrecs, cap;
static int free_old;

static struct record *find_or_add(unsigned sku)
{
    for (size_t i = 0; i < nrecs; i++)
        if (recs[i].sku == sku)
            return &recs[i];
    if (nrecs == cap) {
        cap = cap ? cap * 2 : 16;
        recs = realloc(recs, cap * sizeof *recs);
        if (!recs)
            abort();
    }
    recs[nrecs] = (struct record){.sku = sku};
    return &recs[nrecs++];
}

static void set_description(struct record *r, const char *text, size_t len)
{
    if (free_old)
        free(r->desc);
    r->desc = malloc(len + 1); /* LEAK-SITE */
    if (!r->desc)
        abort();
    memcpy(r->desc, text, len);
    r->desc[len] = '\0';
}

/* The feed sends a product's full description (2-6 KiB of text) with each update. */
static size_t feed_description(char *buf, size_t cap_, unsigned sku, unsigned rev)
{
    int n = snprintf(buf, cap_, "SKU %06u rev %u: ", sku, rev);
    size_t len = 2048 + (sku * 131 + rev * 17) % 4096;
    for (size_t i = n; i < len && i < cap_ - 1; i++)
        buf[i] = "Stainless steel, dishwasher safe. "[(i + rev) % 34];
    return len < cap_ - 1 ? len : cap_ - 1;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "leak";
    if (!strcmp(mode, "fixed"))
        free_old = 1;
    else if (strcmp(mode, "leak")) {
        fprintf(stderr, "usage: %s leak|fixed\n", argv[0]);
        return 2;
    }
    static char buf[8192];
    for (unsigned sku = 0; sku < CATALOGUE; sku++) {
        struct record *r = find_or_add(100000 + sku);
        r->qty = sku % 50;
        set_description(r, buf, feed_description(buf, sizeof buf, r->sku, 0));
    }
    unsigned rng = 12345, updates = 0;
    for (int tick = 0; tick < TICKS; tick++) {
        for (int i = 0; i < UPDATES_PER_TICK; i++, updates++) {
            rng = rng * 1103515245 + 12345;
            struct record *r = find_or_add(100000 + (rng >> 8) % CATALOGUE);
            r->qty = (rng >> 4) % 100;
            set_description(r, buf, feed_description(buf, sizeof buf, r->sku, updates));
        }
        usleep(20000);
    }
    unsigned long stock = 0;
    for (size_t i = 0; i < nrecs; i++)
        stock += recs[i].qty;
    printf("%zu records, %u updates, %lu items in stock\n", nrecs, updates, stock);
    return 0;
}
