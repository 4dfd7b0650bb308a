/* Device UUIDs: the text form NVML prints and the limits file lists, and its 16 bytes. */
#ifndef VC_UUID_H
#define VC_UUID_H

#include <stdbool.h>
#include <stddef.h>

/* Writes GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx for the 16 bytes. */
void vc_uuid_format(const unsigned char bytes[16], char *out, size_t len);

/* Reads the 16 bytes of a UUID written as NVML does, GPU-... or MIG-..., in
 * either case (NVIDIA's tools match UUIDs case-insensitively); false if text
 * is not one. */
bool vc_uuid_parse(const char *text, unsigned char bytes[16]);

#endif
