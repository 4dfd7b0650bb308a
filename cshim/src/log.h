/* Diagnostics on stderr, silent unless VCUDA_LOG_LEVEL asks for more than errors. */
#ifndef VC_LOG_H
#define VC_LOG_H

enum vc_log_level { VC_LOG_OFF, VC_LOG_ERROR, VC_LOG_WARN, VC_LOG_INFO, VC_LOG_DEBUG };

/* Writes "vcuda[pid]: message" to stderr when level is enabled. */
void vc_log(enum vc_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
