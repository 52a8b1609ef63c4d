/* The EC2 twin's clock for an instance: preloaded into every process of an instance (LD_PRELOAD), it moves
 * the wall clock (CLOCK_REALTIME and its coarse variant, gettimeofday, time) GRIDFLEET_TWIN_CLOCK_OFFSET
 * seconds ahead, read once when a process loads it. Monotonic and CPU clocks are left alone, so sleeps,
 * timeouts and intervals are this machine's. It keeps no state shared between processes, so children that
 * change user (the crawl user) inherit it unchanged. Built by scripts/setup.sh. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);

static long long offset_ns;
static clock_gettime_fn real_clock_gettime;

__attribute__((constructor)) static void load(void) {
    const char *text = getenv("GRIDFLEET_TWIN_CLOCK_OFFSET");
    offset_ns = text ? (long long)(strtod(text, NULL) * 1e9) : 0;
    real_clock_gettime = (clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
}

static int shifted(clockid_t id, struct timespec *ts) {
    if (!real_clock_gettime) load();
    int rc = real_clock_gettime(id, ts);
    if (rc == 0 && ts && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
        long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + offset_ns;
        ts->tv_sec = (time_t)(ns / 1000000000LL);
        ts->tv_nsec = (long)(ns % 1000000000LL);
    }
    return rc;
}

int clock_gettime(clockid_t id, struct timespec *ts) { return shifted(id, ts); }

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    struct timespec ts;
    (void)tz;
    if (shifted(CLOCK_REALTIME, &ts) != 0) return -1;
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (shifted(CLOCK_REALTIME, &ts) != 0) return (time_t)-1;
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}
