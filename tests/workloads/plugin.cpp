// A C++ library with a C interface, loaded by plugin_main.c through DT_NEEDED and a
// $ORIGIN-relative RUNPATH: the C program imports nothing that unwinds, its library does.
// plugin_work(m) throws through plugin_thrower() and catches inside the library.
#include <stdexcept>
#include <sys/syscall.h>
#include <unistd.h>

extern "C" {
__attribute__((noinline)) void plugin_thrower(int m) {
    for (int i = 0; i < m; i++) syscall(SYS_getppid);
    throw std::runtime_error("inside the plugin");
}

__attribute__((noinline)) int plugin_work(int m) {
    try {
        plugin_thrower(m);
    } catch (const std::exception &) {
        return 1;
    }
    return 0;
}
}
