/* Prints VCUDA_NEXTHOOK_PROBE as getenv returns it (through libnexthook.so when preloaded). */
#include <stdio.h>
#include <stdlib.h>

int main(void)
{
    const char *value = getenv("VCUDA_NEXTHOOK_PROBE");
    printf("%s\n", value ? value : "(unset)");
    return 0;
}
