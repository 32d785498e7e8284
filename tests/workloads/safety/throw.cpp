#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>
#include <algorithm>
#include <sstream>
static int parse(const std::string &s) {
    if (s.empty() || s[0] == 'x') throw std::invalid_argument("bad: " + s);
    return std::stoi(s);
}
int main() {
    std::vector<std::string> words = {"12", "x7", "40", "", "3"};
    int sum = 0, errors = 0;
    for (auto &w : words) {
        try { sum += parse(w); } catch (const std::exception &e) { ++errors; std::printf("caught %s\n", e.what()); }
    }
    std::sort(words.begin(), words.end());
    std::ostringstream out;
    for (auto &w : words) out << '[' << w << ']';
    std::printf("sum=%d errors=%d %s\n", sum, errors, out.str().c_str());
    try { throw std::runtime_error("to stderr"); } catch (const std::runtime_error &e) { std::fprintf(stderr, "err: %s\n", e.what()); }
    return errors;
}
