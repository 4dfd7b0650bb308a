/* The diagnostic build's unpaced windows (pace_windows.h). */
#include "pace_windows.h"

#ifdef VC_PACE_WINDOWS
#include <stdint.h>
#include <stdlib.h>

#include "bucket.h"

bool vc_unpaced_window(void)
{
    static int64_t window_ns = -1;   /* -1: not read yet; 0: no windows */
    int64_t window = __atomic_load_n(&window_ns, __ATOMIC_RELAXED);
    if (window < 0) {
        const char *text = getenv("VCUDA_PACE_WINDOW_MS");
        long long ms = text ? atoll(text) : 0;
        window = ms > 0 ? ms * 1000000 : 0;
        __atomic_store_n(&window_ns, window, __ATOMIC_RELAXED);
    }
    return window && vc_clock_ns() / window % 2 == 0;
}
#endif
