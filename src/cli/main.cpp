#include <cstdio>
int main() { std::puts("saturate: under construction"); return 0; }
