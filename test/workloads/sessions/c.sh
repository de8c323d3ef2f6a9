#!/usr/bin/env bash
# C: gcc and make in the workspace, running the result.
set -euo pipefail
cd "$WL_DIR"
mkdir -p c && cd c
printf '#include <stdio.h>\n#include "add.h"\nint main(void) { printf("%%d\\n", add(2, 3)); return 0; }\n' > main.c
printf 'int add(int a, int b);\n' > add.h
printf '#include "add.h"\nint add(int a, int b) { return a + b; }\n' > add.c
printf 'all: prog\nprog: main.o add.o\n\t$(CC) -o $@ $^\n%%.o: %%.c add.h\n\t$(CC) -O2 -Wall -c $<\nclean:\n\trm -f prog *.o\n' > Makefile
make -s
test "$(./prog)" = 5
make -s clean && make -s -j2 && ./prog >/dev/null
echo c-ok
