/*
 * A program that never touches CUDA, as most processes of a container. It does
 * what any program may (dlopen, dlsym, getenv) and then reports its threads,
 * its open files and whether a driver library got loaded.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        n += e->d_name[0] != '.';
    if (d)
        closedir(d);
    return n;
}

static int mapped(const char *lib)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096];
    int found = 0;
    while (f && fgets(line, sizeof line, f))
        found |= strstr(line, lib) != NULL;
    if (f)
        fclose(f);
    return found;
}

int main(void)
{
    void *libm = dlopen("libm.so.6", RTLD_NOW);
    double (*cosine)(double) = libm ? (double (*)(double))dlsym(libm, "cos") : NULL;
    void *nothing = libm ? dlsym(libm, "cuMemAlloc_v2") : NULL;
    /* opendir takes one descriptor while /proc/self/fd is counted. */
    printf("threads=%d fds=%d libcuda=%d libnvidia-ml=%d cos=%d unrelated=%s\n",
           count_entries("/proc/self/task"), count_entries("/proc/self/fd") - 1,
           mapped("libcuda.so"), mapped("libnvidia-ml.so"), cosine && cosine(0.0) == 1.0,
           nothing ? "found" : "none");
    return 0;
}
