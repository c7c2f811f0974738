// Document parser: a malformed document's error path returns nullptr without deleting the partial Node tree. Variants: leak | fixed (tree deleted) | spike (fixed + a 40 MiB document parsed and dropped every 25 docs).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

struct Node {
    std::string key;
    char *value = nullptr;
    size_t len = 0;
    std::vector<Node *> children;
    ~Node()
    {
        delete[] value;
        for (Node *c : children)
            delete c;
    }
};

static bool g_cleanup_on_error;

// A record is "key=<len bytes of value>"; a record of length 0 is malformed.
static Node *parse_record(const char *text, size_t len, unsigned i)
{
    Node *n = new Node;
    n->key = "field" + std::to_string(i);
    n->value = new char[len]; /* LEAK-SITE */
    memcpy(n->value, text, len);
    n->len = len;
    return n;
}

static Node *parse_document(const char *text, const std::vector<size_t> &records)
{
    Node *root = new Node;
    root->key = "document";
    size_t off = 0;
    for (unsigned i = 0; i < records.size(); i++) {
        if (records[i] == 0) {
            fprintf(stderr, "record %u: empty value\n", i);
            if (g_cleanup_on_error)
                delete root;
            return nullptr;
        }
        root->children.push_back(parse_record(text + off % 4096, records[i], i));
        off += records[i];
    }
    return root;
}

int main(int argc, char **argv)
{
    std::string mode = argc > 1 ? argv[1] : "leak";
    bool spike = mode == "spike";
    g_cleanup_on_error = spike || mode == "fixed";
    if (!g_cleanup_on_error && mode != "leak") {
        fprintf(stderr, "usage: %s leak|fixed|spike\n", argv[0]);
        return 2;
    }
    std::vector<char> text(128 * 1024, 'v');
    std::vector<size_t> good(24, 4096), bad(24, 4096), huge(640, 64 * 1024);
    bad[23] = 0; // truncated upload: the last record is empty
    unsigned parsed = 0, failed = 0;
    for (int doc = 0; doc < 100; doc++) {
        if (spike && doc % 25 == 12) {
            Node *big = parse_document(text.data(), huge);
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            delete big;
        }
        for (const auto *recs : {&good, &bad}) {
            Node *root = parse_document(text.data(), *recs);
            if (!root) {
                failed++;
                continue;
            }
            parsed++;
            delete root;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    printf("%u documents parsed, %u rejected\n", parsed, failed);
    return 0;
}
