// CPU ns per system call (thread CPU time, so other load on the machine matters little):
// getppid (no file system), fstat of an fd, newfstatat and openat+close of a path, ioctl
// FIONREAD and personality (the calls the seccomp filter checks arguments of), and an
// unlisted number (ENOSYS: the whole allowlist runs). Usage: sysbench [N] [DIR]
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/personality.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
#define TIME(label, n, stmt) do { double t0 = now(); for (long i = 0; i < (n); i++) { stmt; } printf(label " %.0f ", (now() - t0) / (n)); } while (0)
int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 400000;
  const char *path = argc > 2 ? argv[2] : "/usr/share/doc";
  struct stat st; int p[2], v; if (pipe(p)) return 1;
  int fd = open(path, O_RDONLY | O_DIRECTORY);
  TIME("getppid", n, syscall(SYS_getppid));
  TIME("fstat", n, fstat(fd, &st));
  TIME("stat", n / 4, fstatat(AT_FDCWD, path, &st, AT_SYMLINK_NOFOLLOW));
  TIME("open+close", n / 4, close(openat(AT_FDCWD, path, O_RDONLY | O_DIRECTORY)));
  TIME("ioctl", n, ioctl(p[0], FIONREAD, &v));
  TIME("personality", n, personality(0xffffffff));
  TIME("enosys", n / 4, syscall(600));
  printf("ns\n");
  return 0;
}
