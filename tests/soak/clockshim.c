/* A step of a device's wall clock, for the soak harness (tests/soak/soakclock.py): an
 * LD_PRELOAD library that adds an offset to every read of the wall clock and leaves the
 * monotonic and boot clocks alone, as `date -s` or an NTP step does on a real device.
 *
 * The offset, in nanoseconds, is a native int64 at the start of the file named by
 * SOAK_CLOCK_OFFSET_FILE, which the harness rewrites in place. The file is mapped once (shared,
 * read-only): a read of the clock costs one load more than without the shim, no system call.
 * Without the variable the shim adds nothing; with it, a file that cannot be mapped is a
 * refusal to start (the process exits 127 saying why), never a clock silently left true.
 *
 * Wall clocks: CLOCK_REALTIME, CLOCK_REALTIME_COARSE, CLOCK_REALTIME_ALARM and CLOCK_TAI, read
 * through clock_gettime, gettimeofday, time and timespec_get (libc calls its own clock_gettime
 * directly, so each entry point is its own symbol here). Waits until a wall-clock time
 * (clock_nanosleep with TIMER_ABSTIME, pthread_cond_timedwait on a condition variable of the
 * default clock, pthread_cond_clockwait, sem_timedwait, sem_clockwait, pthread_mutex_timedlock,
 * pthread_mutex_clocklock) have the offset taken off their deadline before the kernel sees it,
 * as a real step moves the kernel's clock under them. Not shifted: timestamps the kernel
 * makes (file times, SO_TIMESTAMP), timerfd and POSIX timers, rwlock and message-queue
 * deadlines, and programs that make the system call themselves (Go).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define NS 1000000000LL

static const int64_t *offset_map; /* NULL: no offset (the variable is unset) */

static int (*real_clock_gettime)(clockid_t, struct timespec *);
static int (*real_gettimeofday)(struct timeval *, void *);
static int (*real_clock_nanosleep)(clockid_t, int, const struct timespec *, struct timespec *);
static int (*real_cond_timedwait)(pthread_cond_t *, pthread_mutex_t *, const struct timespec *);
static int (*real_cond_clockwait)(pthread_cond_t *, pthread_mutex_t *, clockid_t,
                                  const struct timespec *);
static int (*real_sem_timedwait)(sem_t *, const struct timespec *);
static int (*real_sem_clockwait)(sem_t *, clockid_t, const struct timespec *);
static int (*real_mutex_timedlock)(pthread_mutex_t *, const struct timespec *);
static int (*real_mutex_clocklock)(pthread_mutex_t *, clockid_t, const struct timespec *);

static void *next(const char *name) {
    void *fn = dlsym(RTLD_NEXT, name);
    if (fn == NULL) {
        fprintf(stderr, "clockshim: %s not found in the libraries after this one\n", name);
        _exit(127);
    }
    return fn;
}

#define RESOLVE(var, name)                                                                   \
    do {                                                                                     \
        if (__builtin_expect(var == NULL, 0)) *(void **)&var = next(name);                  \
    } while (0)

__attribute__((constructor)) static void clockshim_init(void) {
    RESOLVE(real_clock_gettime, "clock_gettime");
    const char *path = getenv("SOAK_CLOCK_OFFSET_FILE");
    if (path == NULL || path[0] == '\0') return;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    void *map = MAP_FAILED;
    if (fd >= 0) {
        map = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
    }
    if (map == MAP_FAILED) {
        fprintf(stderr, "clockshim: SOAK_CLOCK_OFFSET_FILE=%s cannot be mapped\n", path);
        _exit(127);
    }
    offset_map = map;
}

static inline int64_t offset(void) {
    return offset_map == NULL ? 0 : __atomic_load_n(offset_map, __ATOMIC_RELAXED);
}

static inline int is_wall(clockid_t clk) {
    return clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE || clk == CLOCK_TAI ||
           clk == CLOCK_REALTIME_ALARM;
}

static inline void shift(struct timespec *ts, int64_t by) {
    int64_t ns = (int64_t)ts->tv_nsec + by % NS;
    ts->tv_sec += by / NS + ns / NS;
    ns %= NS;
    if (ns < 0) {
        ns += NS;
        ts->tv_sec -= 1;
    }
    ts->tv_nsec = ns;
}

/* a wall-clock deadline as the kernel's (true) clock reads it */
static inline const struct timespec *deadline(const struct timespec *at, struct timespec *out) {
    int64_t by = offset();
    if (at == NULL || by == 0) return at;
    *out = *at;
    shift(out, -by);
    return out;
}

int clock_gettime(clockid_t clk, struct timespec *ts) {
    RESOLVE(real_clock_gettime, "clock_gettime");
    int rc = real_clock_gettime(clk, ts);
    if (rc == 0 && is_wall(clk)) shift(ts, offset());
    return rc;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    RESOLVE(real_gettimeofday, "gettimeofday");
    struct timespec ts;
    if (tz != NULL && real_gettimeofday(NULL, tz) != 0) return -1;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return -1;
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return (time_t)-1;
    if (out != NULL) *out = ts.tv_sec;
    return ts.tv_sec;
}

int timespec_get(struct timespec *ts, int base) {
    if (base != TIME_UTC || clock_gettime(CLOCK_REALTIME, ts) != 0) return 0;
    return base;
}

int clock_nanosleep(clockid_t clk, int flags, const struct timespec *req, struct timespec *rem) {
    RESOLVE(real_clock_nanosleep, "clock_nanosleep");
    struct timespec at;
    if ((flags & TIMER_ABSTIME) && is_wall(clk)) req = deadline(req, &at);
    return real_clock_nanosleep(clk, flags, req, rem);
}

int pthread_cond_timedwait(pthread_cond_t *restrict cond, pthread_mutex_t *restrict mutex,
                           const struct timespec *restrict abstime) {
    RESOLVE(real_cond_timedwait, "pthread_cond_timedwait");
    struct timespec at;
    /* glibc keeps the clock a condition variable waits on in bit 1 of __wrefs (1: monotonic) */
    if ((cond->__data.__wrefs & 2) == 0) abstime = deadline(abstime, &at);
    return real_cond_timedwait(cond, mutex, abstime);
}

int pthread_cond_clockwait(pthread_cond_t *restrict cond, pthread_mutex_t *restrict mutex,
                           clockid_t clk, const struct timespec *restrict abstime) {
    RESOLVE(real_cond_clockwait, "pthread_cond_clockwait");
    struct timespec at;
    if (is_wall(clk)) abstime = deadline(abstime, &at);
    return real_cond_clockwait(cond, mutex, clk, abstime);
}

int sem_timedwait(sem_t *restrict sem, const struct timespec *restrict abstime) {
    RESOLVE(real_sem_timedwait, "sem_timedwait");
    struct timespec at;
    return real_sem_timedwait(sem, deadline(abstime, &at));
}

int sem_clockwait(sem_t *restrict sem, clockid_t clk, const struct timespec *restrict abstime) {
    RESOLVE(real_sem_clockwait, "sem_clockwait");
    struct timespec at;
    if (is_wall(clk)) abstime = deadline(abstime, &at);
    return real_sem_clockwait(sem, clk, abstime);
}

int pthread_mutex_timedlock(pthread_mutex_t *restrict mutex,
                            const struct timespec *restrict abstime) {
    RESOLVE(real_mutex_timedlock, "pthread_mutex_timedlock");
    struct timespec at;
    return real_mutex_timedlock(mutex, deadline(abstime, &at));
}

int pthread_mutex_clocklock(pthread_mutex_t *restrict mutex, clockid_t clk,
                            const struct timespec *restrict abstime) {
    RESOLVE(real_mutex_clocklock, "pthread_mutex_clocklock");
    struct timespec at;
    if (is_wall(clk)) abstime = deadline(abstime, &at);
    return real_mutex_clocklock(mutex, clk, abstime);
}
