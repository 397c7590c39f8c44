// The probe behind bench/emu/README.md's paced loopback figures (runs 6 and 7): thread CPU of a loopback TCP
// transfer when the sender writes CHUNK bytes then sleeps SLEEP_US (a link's pace) and the receiver reads what arrived.
// Not part of the build: gcc -O2 -o probe tcp_paced_probe.c -lpthread; ./probe CHUNK RECVBUF SLEEP_US TOTAL_BYTES
// loopback TCP CPU per byte when the receiver reads what arrives in small pieces (sender writes `chunk` bytes per send)
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
static double tcpu(void){struct timespec t;clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t);return t.tv_sec+1e-9*t.tv_nsec;}
static int in_fd; static long total; static double rcpu; static size_t rbuf;
static void* rx(void* a){(void)a;char*b=malloc(rbuf);long got=0;double t0=tcpu();while(got<total){ssize_t n=recv(in_fd,b,rbuf,0);if(n<=0)break;got+=n;}rcpu=tcpu()-t0;free(b);return 0;}
int main(int argc,char**argv){size_t chunk=atol(argv[1]);rbuf=atol(argv[2]);long usleep_us=atol(argv[3]);total=atol(argv[4]);
int l=socket(AF_INET,SOCK_STREAM,0);struct sockaddr_in a={0};a.sin_family=AF_INET;a.sin_addr.s_addr=htonl(INADDR_LOOPBACK);socklen_t len=sizeof a;
bind(l,(void*)&a,sizeof a);listen(l,1);getsockname(l,(void*)&a,&len);int o=socket(AF_INET,SOCK_STREAM,0);int one=1;setsockopt(o,IPPROTO_TCP,TCP_NODELAY,&one,4);
connect(o,(void*)&a,sizeof a);in_fd=accept(l,0,0);pthread_t th;pthread_create(&th,0,rx,0);char*d=calloc(chunk,1);long sent=0;double t0=tcpu();
while(sent<total){ssize_t n=send(o,d,chunk,0);if(n<=0)break;sent+=n;if(usleep_us)usleep(usleep_us);}double scpu=tcpu()-t0;pthread_join(th,0);
printf("chunk %zu recvbuf %zu sleep %ld us: send %.2f ns/B recv %.2f ns/B per side %.2f ns/B\n",chunk,rbuf,usleep_us,scpu/total*1e9,rcpu/total*1e9,(scpu+rcpu)/2/total*1e9);return 0;}
