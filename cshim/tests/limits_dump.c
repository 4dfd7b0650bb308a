/* Prints what the shim's parser makes of a limits file, one key=value a line, or its error. */
#include <stdio.h>
#include <stdlib.h>

#include "limits_file.h"

int main(int argc, char **argv)
{
    static char text[1 << 16];
    FILE *f = argc == 2 ? fopen(argv[1], "rb") : NULL;
    if (!f) {
        fprintf(stderr, "usage: limits_dump FILE\n");
        return 2;
    }
    size_t n = fread(text, 1, sizeof text, f);
    fclose(f);
    struct vc_limits limits;
    char err[512];
    if (vc_limits_parse(text, n, &limits, err, sizeof err) != 0) {
        printf("error=%s\n", err);
        return 1;
    }
    printf("memory=%llu\ncores=%u\n", (unsigned long long)limits.memory, limits.cores);
    for (unsigned i = 0; i < limits.ndevices; i++)
        printf("device=%s\n", limits.devices[i]);
    printf("account=%s\n", limits.account);
    return 0;
}
