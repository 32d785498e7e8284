/* Runs Python code through libpython3.11.so (Debian's python3.11 binary embeds the
 * interpreter statically, so probing the shared library needs a program that loads it). */
#include <Python.h>

int main(int argc, char **argv) {
    Py_Initialize();
    int rc = PyRun_SimpleString(argc > 1 ? argv[1] : "print('no code given')");
    if (Py_FinalizeEx() < 0)
        return 120;
    return rc == 0 ? 0 : 1;
}
