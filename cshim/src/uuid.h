/* A device UUID in the text form NVML prints and the limits file lists. */
#ifndef VC_UUID_H
#define VC_UUID_H

#include <stddef.h>

/* Writes GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx for the 16 bytes. */
void vc_uuid_format(const unsigned char bytes[16], char *out, size_t len);

#endif
