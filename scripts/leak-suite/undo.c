/* Editor session: every edit pushes a full document snapshot onto the undo history, all freed by editor_close() before exit. Variants: leak (unbounded history) | bounded (last 16). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TICKS 100
#define DOC_SIZE (96 * 1024)

struct snapshot {
    struct snapshot *prev;
    size_t len;
    char *text;
};

struct editor {
    char *doc;
    size_t len;
    struct snapshot *undo;
    size_t depth, max_depth;
};

static void free_snapshots(struct snapshot *s)
{
    while (s) {
        struct snapshot *prev = s->prev;
        free(s->text);
        free(s);
        s = prev;
    }
}

static void push_undo(struct editor *ed)
{
    struct snapshot *s = malloc(sizeof *s);
    if (!s)
        abort();
    s->text = malloc(ed->len); /* LEAK-SITE */
    if (!s->text)
        abort();
    memcpy(s->text, ed->doc, ed->len);
    s->len = ed->len;
    s->prev = ed->undo;
    ed->undo = s;
    if (++ed->depth > ed->max_depth && ed->max_depth) {
        struct snapshot *keep = ed->undo;
        for (size_t i = 1; i < ed->max_depth; i++)
            keep = keep->prev;
        free_snapshots(keep->prev);
        keep->prev = NULL;
        ed->depth = ed->max_depth;
    }
}

static void edit(struct editor *ed, size_t pos, const char *text)
{
    push_undo(ed);
    size_t n = strlen(text);
    if (pos + n > ed->len)
        pos = ed->len - n;
    memcpy(ed->doc + pos, text, n);
}

static void editor_close(struct editor *ed)
{
    free_snapshots(ed->undo);
    free(ed->doc);
    memset(ed, 0, sizeof *ed);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "leak";
    struct editor ed = {0};
    if (!strcmp(mode, "bounded"))
        ed.max_depth = 16;
    else if (strcmp(mode, "leak")) {
        fprintf(stderr, "usage: %s leak|bounded\n", argv[0]);
        return 2;
    }
    ed.len = DOC_SIZE;
    ed.doc = malloc(ed.len);
    if (!ed.doc)
        return 1;
    for (size_t i = 0; i < ed.len; i++)
        ed.doc[i] = i % 72 == 71 ? '\n' : "lorem ipsum dolor sit amet "[i % 27];
    static const char *words[] = {"TODO ", "fixed ", "the quick brown fox ", "return 0; "};
    unsigned rng = 7;
    for (int tick = 0; tick < TICKS; tick++) {
        rng = rng * 1103515245 + 12345;
        edit(&ed, (rng >> 8) % ed.len, words[tick % 4]);
        usleep(20000);
    }
    size_t depth = ed.depth;
    editor_close(&ed);
    printf("closed editor with %zu undo steps\n", depth);
    return 0;
}
