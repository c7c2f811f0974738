/* Thread pool (3 workers): a job failing its checksum is rejected on an error path that forgets its calloc'ed payload. Variants: leak | fixed (that path frees it). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WORKERS 3
#define TICKS 100
#define JOBS_PER_TICK 6
#define PAYLOAD (48 * 1024)

struct job {
    struct job *next;
    unsigned id;
    uint32_t sum;
    unsigned char *payload;
};

static struct job *queue_head, *queue_tail;
static int shutting_down, free_on_error;
static unsigned long done, rejected;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ready = PTHREAD_COND_INITIALIZER;

static uint32_t checksum(const unsigned char *p, size_t n)
{
    uint32_t a = 1, b = 0;
    for (size_t i = 0; i < n; i++) {
        a = (a + p[i]) % 65521;
        b = (b + a) % 65521;
    }
    return b << 16 | a;
}

static struct job *make_job(unsigned id)
{
    struct job *j = malloc(sizeof *j);
    j->payload = calloc(1, PAYLOAD); /* LEAK-SITE */
    j->next = NULL;
    j->id = id;
    for (size_t i = 0; i < PAYLOAD; i++)
        j->payload[i] = (unsigned char)(id * 31 + i);
    j->sum = checksum(j->payload, PAYLOAD);
    if (id % 3 == 2) /* corrupted in transit */
        j->payload[id % PAYLOAD] ^= 0x5a;
    return j;
}

static int process(struct job *j)
{
    if (checksum(j->payload, PAYLOAD) != j->sum) {
        if (free_on_error)
            free(j->payload);
        free(j);
        return -1;
    }
    free(j->payload);
    free(j);
    return 0;
}

static void *worker(void *arg)
{
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&lock);
        while (!queue_head && !shutting_down)
            pthread_cond_wait(&ready, &lock);
        struct job *j = queue_head;
        if (j && !(queue_head = j->next))
            queue_tail = NULL;
        pthread_mutex_unlock(&lock);
        if (!j)
            return NULL;
        int rc = process(j);
        pthread_mutex_lock(&lock);
        *(rc ? &rejected : &done) += 1;
        pthread_mutex_unlock(&lock);
    }
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "leak";
    if (!strcmp(mode, "fixed"))
        free_on_error = 1;
    else if (strcmp(mode, "leak")) {
        fprintf(stderr, "usage: %s leak|fixed\n", argv[0]);
        return 2;
    }
    pthread_t tid[WORKERS];
    for (int i = 0; i < WORKERS; i++)
        pthread_create(&tid[i], NULL, worker, NULL);
    unsigned id = 0;
    for (int tick = 0; tick < TICKS; tick++) {
        for (int i = 0; i < JOBS_PER_TICK; i++) {
            struct job *j = make_job(id++);
            pthread_mutex_lock(&lock);
            if (queue_tail)
                queue_tail->next = j;
            else
                queue_head = j;
            queue_tail = j;
            pthread_cond_signal(&ready);
            pthread_mutex_unlock(&lock);
        }
        usleep(20000);
    }
    pthread_mutex_lock(&lock);
    shutting_down = 1;
    pthread_cond_broadcast(&ready);
    pthread_mutex_unlock(&lock);
    for (int i = 0; i < WORKERS; i++)
        pthread_join(tid[i], NULL);
    printf("%lu jobs done, %lu rejected\n", done, rejected);
    return 0;
}
