// Application log: each formatted line is appended to a global std::vector<std::string> cleared only by its destructor at exit. Variants: leak | bounded (ring of the last 512 lines).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

static std::vector<std::string> g_log;
static size_t g_ring; // 0: keep every line
static size_t g_next;

static void log_line(const char *level, unsigned seq, const std::string &detail)
{
    char buf[4096];
    int n = snprintf(buf, sizeof buf, "[%06u] %-5s handler=orders latency_ms=%u detail=%s", seq, level,
                     seq % 250, detail.c_str());
    if (n >= (int)sizeof buf)
        n = sizeof buf - 1;
    std::string line(buf, n); /* LEAK-SITE */
    if (!g_ring) {
        g_log.push_back(std::move(line));
    } else {
        if (g_log.size() < g_ring)
            g_log.push_back(std::move(line));
        else
            g_log[g_next % g_ring] = std::move(line);
        g_next++;
    }
}

int main(int argc, char **argv)
{
    std::string mode = argc > 1 ? argv[1] : "leak";
    if (mode == "bounded")
        g_ring = 512;
    else if (mode != "leak") {
        fprintf(stderr, "usage: %s leak|bounded\n", argv[0]);
        return 2;
    }
    std::string detail;
    for (int i = 0; i < 80; i++)
        detail += "item=" + std::to_string(4000 + i * 7) + ",qty=3;";
    unsigned seq = 0;
    for (int tick = 0; tick < 100; tick++) {
        for (int i = 0; i < 48; i++, seq++)
            log_line(seq % 10 ? "INFO" : "WARN", seq, detail.substr(seq % 40));
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    printf("%zu log lines held\n", g_log.size());
    return 0;
}
