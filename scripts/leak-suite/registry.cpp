// Buffer registry fed by 3 worker threads: release() only marks a std::unique_ptr<Buffer> unused, nothing prunes the map. Variants: leak | fixed (release() erases the entry).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

struct Buffer {
    explicit Buffer(size_t n)
        : data(n) /* LEAK-SITE */
    {
    }
    std::vector<char> data;
    bool in_use = true;
};

static std::mutex g_lock;
static std::unordered_map<uint64_t, std::unique_ptr<Buffer>> g_registry;
static uint64_t g_next_handle = 1;
static bool g_prune;

static uint64_t register_buffer(std::unique_ptr<Buffer> buf)
{
    std::lock_guard<std::mutex> guard(g_lock);
    uint64_t h = g_next_handle++;
    g_registry.emplace(h, std::move(buf));
    return h;
}

static void release(uint64_t h)
{
    std::lock_guard<std::mutex> guard(g_lock);
    auto it = g_registry.find(h);
    if (it == g_registry.end())
        return;
    if (g_prune)
        g_registry.erase(it);
    else
        it->second->in_use = false;
}

static void worker(unsigned wid)
{
    for (int tick = 0; tick < 100; tick++) {
        auto buf = std::make_unique<Buffer>(32 * 1024);
        memset(buf->data.data(), 'A' + wid, buf->data.size()); // decoded frame
        uint64_t h = register_buffer(std::move(buf));
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        release(h);
    }
}

int main(int argc, char **argv)
{
    std::string mode = argc > 1 ? argv[1] : "leak";
    if (mode == "fixed")
        g_prune = true;
    else if (mode != "leak") {
        fprintf(stderr, "usage: %s leak|fixed\n", argv[0]);
        return 2;
    }
    std::vector<std::thread> workers;
    for (unsigned w = 0; w < 3; w++)
        workers.emplace_back(worker, w);
    for (auto &t : workers)
        t.join();
    size_t idle = 0;
    for (const auto &kv : g_registry)
        idle += !kv.second->in_use;
    printf("%zu buffers registered, %zu idle\n", g_registry.size(), idle);
    return 0;
}
