// C++ workload: a member function for demangled-name probes, and an exception thrown through
// a probed function (its return never comes).
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

__attribute__((noinline)) void after(int n) {
    for (int i = 0; i < n; i++) syscall(SYS_getppid);
}
}  // namespace app

int main() {
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
