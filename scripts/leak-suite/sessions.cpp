// Session store std::map<std::string, std::vector<char>>: logout only clear()s the state, keeping key and capacity. Variants: leak | fixed (logout erases the session).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

static std::map<std::string, std::vector<char>> g_sessions;
static bool g_erase_on_logout;
static constexpr size_t kStateSize = 32 * 1024;

static std::string login(unsigned user, unsigned seq)
{
    char id[48];
    snprintf(id, sizeof id, "sess-%08x-%06u", user * 2654435761u, seq);
    std::vector<char> state(kStateSize); /* LEAK-SITE */
    snprintf(state.data(), state.size(), "user=%u;cart=;prefs=dark,compact;", user);
    g_sessions.emplace(id, std::move(state));
    return id;
}

static size_t handle(const std::string &id, unsigned req)
{
    auto it = g_sessions.find(id);
    if (it == g_sessions.end())
        return 0;
    std::vector<char> &state = it->second;
    size_t off = 64 + (req * 4096) % (state.size() - 4096);
    memset(state.data() + off, 'a' + req % 26, 4096); // the cart grows
    return state.size();
}

static void logout(const std::string &id)
{
    auto it = g_sessions.find(id);
    if (it == g_sessions.end())
        return;
    if (g_erase_on_logout)
        g_sessions.erase(it);
    else
        it->second.clear(); // "drop" the state
}

int main(int argc, char **argv)
{
    std::string mode = argc > 1 ? argv[1] : "leak";
    if (mode == "fixed")
        g_erase_on_logout = true;
    else if (mode != "leak") {
        fprintf(stderr, "usage: %s leak|fixed\n", argv[0]);
        return 2;
    }
    std::vector<std::string> active;
    size_t served = 0;
    unsigned seq = 0;
    for (int tick = 0; tick < 100; tick++) {
        for (int i = 0; i < 3; i++, seq++)
            active.push_back(login(1000 + seq % 97, seq));
        for (unsigned r = 0; r < 8; r++)
            served += handle(active[(seq + r) % active.size()], seq + r);
        while (active.size() > 12) {
            logout(active.front());
            active.erase(active.begin());
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    printf("%zu sessions in store, %zu bytes served\n", g_sessions.size(), served);
    return 0;
}
