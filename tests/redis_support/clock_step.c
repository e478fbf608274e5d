/* Steps the wall clock of the process it is preloaded into by the number of
 * seconds written in the file $CLOCK_STEP_FILE (read at every call), leaving
 * the monotonic clocks alone: what an NTP step or an operator's `date -s`
 * does to a Redis server. Built by the clock tests with `cc -shared`.
 *
 * faketime does the same but deadlocks against the jemalloc Debian's
 * redis-server is linked with; this shim allocates nothing and calls the
 * kernel directly, so it cannot recurse into the allocator. */

#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long step_seconds(void) {
  const char *path = getenv("CLOCK_STEP_FILE");
  if (path == NULL) {
    return 0;
  }
  int fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY);
  if (fd < 0) {
    return 0;
  }
  char buf[32];
  long n = syscall(SYS_read, fd, buf, sizeof buf - 1);
  syscall(SYS_close, fd);
  if (n <= 0) {
    return 0;
  }
  long sign = 1, value = 0;
  long i = 0;
  if (buf[0] == '-' || buf[0] == '+') {
    sign = buf[0] == '-' ? -1 : 1;
    i = 1;
  }
  for (; i < n && buf[i] >= '0' && buf[i] <= '9'; i++) {
    value = value * 10 + (buf[i] - '0');
  }
  return sign * value;
}

static int is_wall(clockid_t id) {
  return id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
  long r = syscall(SYS_clock_gettime, id, ts);
  if (r == 0 && is_wall(id)) {
    ts->tv_sec += step_seconds();
  }
  return (int)r;
}

int gettimeofday(struct timeval *tv, void *tz) {
  (void)tz;
  struct timespec ts;
  long r = syscall(SYS_clock_gettime, CLOCK_REALTIME, &ts);
  if (r != 0) {
    return (int)r;
  }
  if (tv != NULL) {
    tv->tv_sec = ts.tv_sec + step_seconds();
    tv->tv_usec = ts.tv_nsec / 1000;
  }
  return 0;
}

time_t time(time_t *out) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  if (out != NULL) {
    *out = ts.tv_sec;
  }
  return ts.tv_sec;
}
