/* Formats and reads device UUIDs as NVML writes them. */
#include "uuid.h"

#include <stdio.h>
#include <strings.h>

void vc_uuid_format(const unsigned char bytes[16], char *out, size_t len)
{
    const unsigned char *b = bytes;
    snprintf(out, len,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
             b[15]);
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

bool vc_uuid_parse(const char *text, unsigned char bytes[16])
{
    if (strncasecmp(text, "GPU-", 4) != 0 && strncasecmp(text, "MIG-", 4) != 0)
        return false;
    const char *p = text + 4;
    /* 8-4-4-4-12 hex digits: a dash before bytes 4, 6, 8 and 10. */
    for (int i = 0; i < 16; i++) {
        if ((i == 4 || i == 6 || i == 8 || i == 10) && *p++ != '-')
            return false;
        int high = hex_digit(p[0]), low = high < 0 ? -1 : hex_digit(p[1]);
        if (low < 0)
            return false;
        bytes[i] = (unsigned char)(high << 4 | low);
        p += 2;
    }
    return *p == '\0';
}
