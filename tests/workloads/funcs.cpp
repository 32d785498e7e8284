// C++ workload: a member function for demangled-name probes, and exceptions thrown through
// probed functions (their returns never come). `funcs-cpp throw K`: K exceptions thrown by
// thrower() through middle(), each caught in main.
#include <cstdio>
#include <stdexcept>
#include <string>
#include <sys/syscall.h>
#include <unistd.h>

namespace app {
struct Parser {
    __attribute__((noinline)) int parse(const std::string &input);
};

__attribute__((noinline)) int Parser::parse(const std::string &input) {
    for (size_t i = 0; i < input.size(); i++) syscall(SYS_getppid);
    return static_cast<int>(input.size());
}

__attribute__((noinline)) void thrower(int n) {
    for (int i = 0; i < n; i++) syscall(SYS_getppid);
    throw std::runtime_error("through a probed function");
}

// n getppid calls, then m more in thrower(), which throws through it.
__attribute__((noinline)) void middle(int n, int m) {
    for (int i = 0; i < n; i++) syscall(SYS_getppid);
    thrower(m);
}

__attribute__((noinline)) void after(int n) {
    for (int i = 0; i < n; i++) syscall(SYS_getppid);
}
}  // namespace app

int main(int argc, char **argv) {
    if (argc == 3 && std::string(argv[1]) == "throw") {
        int times = std::stoi(argv[2]), caught = 0;
        for (int i = 0; i < times; i++) {
            try {
                app::middle(2, 3);
            } catch (const std::runtime_error &) {
                caught++;
            }
        }
        std::printf("caught=%d\n", caught);
        return 0;
    }
    app::Parser parser;
    parser.parse(std::string(12, 'x'));
    try {
        app::thrower(9);
    } catch (const std::exception &) {
    }
    app::after(4);
    std::printf("pid=%d\n", getpid());
    return 0;
}
