/* Formats device UUIDs as NVML does. */
#include "uuid.h"

#include <stdio.h>

void vc_uuid_format(const unsigned char bytes[16], char *out, size_t len)
{
    const unsigned char *b = bytes;
    snprintf(out, len,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
             b[15]);
}
