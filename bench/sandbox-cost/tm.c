// tm CMD...: run CMD (stdout to /dev/null), print "wall_ms cpu_ms" (cpu = user+sys of CMD and its children).
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <sys/resource.h>
int main(int argc,char**argv){
  struct timespec a,b; clock_gettime(CLOCK_MONOTONIC,&a);
  pid_t p=fork(); if(!p){int fd=open("/dev/null",O_WRONLY);dup2(fd,1);execvp(argv[1],argv+1);_exit(127);}
  int st; struct rusage ru; wait4(p,&st,0,&ru); clock_gettime(CLOCK_MONOTONIC,&b);
  double w=(b.tv_sec-a.tv_sec)*1e3+(b.tv_nsec-a.tv_nsec)/1e6;
  double c=(ru.ru_utime.tv_sec+ru.ru_stime.tv_sec)*1e3+(ru.ru_utime.tv_usec+ru.ru_stime.tv_usec)/1e3;
  printf("%.1f %.1f\n",w,c); return 0;}
