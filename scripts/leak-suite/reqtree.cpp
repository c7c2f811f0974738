// Request/Part shared_ptr cycle (each Part holds its Request by shared_ptr) keeps every request's parts alive. Variants: leak | fixed (finish() clears the parts, breaking the cycle).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

struct Request;

struct Part {
    std::shared_ptr<Request> owner;
    unsigned index = 0;
    size_t len = 0;
    char data[24 * 1024];
};

struct Request {
    unsigned id = 0;
    std::string path;
    std::vector<std::shared_ptr<Part>> parts;
};

static std::shared_ptr<Request> parse_multipart(unsigned id, const char *body, size_t parts)
{
    auto req = std::make_shared<Request>();
    req->id = id;
    req->path = "/upload/" + std::to_string(id);
    for (size_t i = 0; i < parts; i++) {
        auto part = std::make_shared<Part>(); /* LEAK-SITE */
        part->owner = req;
        part->index = i;
        part->len = sizeof part->data;
        memcpy(part->data, body + i * 64, part->len);
        req->parts.push_back(part);
    }
    return req;
}

static size_t store(const Request &req)
{
    size_t total = 0;
    for (const auto &p : req.parts)
        total += p->len + (p->data[p->len / 2] == 'x');
    return total;
}

static void finish(Request &req) { req.parts.clear(); }

int main(int argc, char **argv)
{
    std::string mode = argc > 1 ? argv[1] : "leak";
    bool fixed = mode == "fixed";
    if (!fixed && mode != "leak") {
        fprintf(stderr, "usage: %s leak|fixed\n", argv[0]);
        return 2;
    }
    static char body[32 * 1024];
    memset(body, 'x', sizeof body);
    size_t stored = 0;
    for (unsigned id = 0; id < 100; id++) {
        auto req = parse_multipart(id, body, 4);
        stored += store(*req);
        if (fixed)
            finish(*req);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    printf("stored %zu bytes\n", stored);
    return 0;
}
