/* tandem-emu-latency: adds a fixed one-way delay to every packet of an NFQUEUE queue.
 *
 * This kernel has no netem, so the emulated cluster (tools/emu-cluster) delays packets in user space:
 * inside each host's network namespace an iptables rule
 *   iptables -t mangle -A PREROUTING -i eth0 -j NFQUEUE --queue-num 0 --queue-bypass
 * hands every packet the host receives to this program, which holds it for --delay-us and then accepts
 * it; with every host doing so, each direction of each path gets the delay once.
 *
 * Why on receive and not on send (POSTROUTING): a packet held on the sending side still belongs to the
 * sending socket, and TCP Small Queues then limits the socket to ~1 ms of data below it, so a delayed
 * TCP flow collapsed (33 Mbit/s through a 100 Mbit/s link with 2 ms). netem avoids this by orphaning
 * the packet; user space cannot. On receive, ip_rcv has already orphaned it before PREROUTING.
 *
 * Every packet gets the same delay, so release order is arrival order: a FIFO of (packet id, due time)
 * is enough, and one batch verdict ("accept every id up to N") releases all packets that are due.
 * Only metadata is copied (NFQNL_COPY_META) and GSO packets stay unsegmented, which keeps the cost
 * low: ~10% of a core at 700 Mbit/s here, most of it the kernel delivering the released packets.
 *
 * Usage: tandem-emu-latency --delay-us D [--queue N] [--maxlen P] [--ready-file F] [--stats-file F]
 *                           [--nice N] [--rt-priority P]
 * --rt-priority runs the program SCHED_FIFO: an emulated wire must not wait behind busy hosts for a
 * time slice (under a loaded machine, plain CFS added up to ~10 ms to single packets here). It uses a
 * few percent of a core, and the kernel's RT throttling still bounds it.
 * Exits 0 on SIGTERM/SIGINT after releasing every held packet; 2 on bad arguments; 1 on setup failure.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <linux/netfilter.h>
#include <linux/netlink.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef struct held_packet {
  uint32_t id;
  int64_t due_ns; /* CLOCK_MONOTONIC */
} held_packet;

typedef struct delay_queue {
  held_packet* ring;
  uint32_t capacity; /* power of two */
  uint32_t head;     /* next to release */
  uint32_t tail;     /* next free slot */
  int64_t delay_ns;
  struct nfq_q_handle* qh;
  /* statistics */
  uint64_t packets;
  uint64_t overflow; /* accepted at once because the ring was full */
  uint32_t max_depth;
  int64_t late_sum_ns; /* release time minus due time, summed */
  int64_t late_max_ns;
  uint64_t released;
} delay_queue;

static volatile sig_atomic_t g_stop = 0;

static void on_signal(int sig) {
  (void)sig;
  g_stop = 1;
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static uint32_t depth(const delay_queue* q) { return q->tail - q->head; }

static int on_packet(struct nfq_q_handle* qh, struct nfgenmsg* msg, struct nfq_data* nfa, void* data) {
  (void)msg;
  delay_queue* q = (delay_queue*)data;
  struct nfqnl_msg_packet_hdr* ph = nfq_get_msg_packet_hdr(nfa);
  if (ph == NULL) return 0;
  uint32_t id = ntohl(ph->packet_id);
  q->packets++;
  if (depth(q) == q->capacity) {
    /* Cannot happen while the kernel queue length equals the ring size; never drop. */
    q->overflow++;
    nfq_set_verdict(qh, id, NF_ACCEPT, 0, NULL);
    return 0;
  }
  held_packet* p = &q->ring[q->tail & (q->capacity - 1)];
  p->id = id;
  p->due_ns = now_ns() + q->delay_ns;
  q->tail++;
  if (depth(q) > q->max_depth) q->max_depth = depth(q);
  return 0;
}

/* Accepts every packet whose due time has passed with one batch verdict; returns ns until the next. */
static int64_t release_due(delay_queue* q) {
  int64_t t = now_ns();
  uint32_t last = 0;
  int any = 0;
  while (depth(q) > 0) {
    held_packet* p = &q->ring[q->head & (q->capacity - 1)];
    if (p->due_ns > t && !g_stop) return p->due_ns - t;
    int64_t late = t - p->due_ns;
    if (late > 0) {
      q->late_sum_ns += late;
      if (late > q->late_max_ns) q->late_max_ns = late;
    }
    q->released++;
    last = p->id;
    any = 1;
    q->head++;
  }
  if (any) nfq_set_verdict_batch(q->qh, last, NF_ACCEPT);
  return -1;
}

static void write_stats(const char* path, const delay_queue* q, int final) {
  if (path == NULL) return;
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE* f = fopen(tmp, "w");
  if (f == NULL) return;
  fprintf(f,
          "{\"delay_us\": %" PRId64 ", \"packets\": %" PRIu64 ", \"held\": %u, \"max_held\": %u, "
          "\"overflow\": %" PRIu64 ", \"mean_late_us\": %.1f, \"max_late_us\": %.1f, \"final\": %s}\n",
          q->delay_ns / 1000, q->packets, depth(q), q->max_depth, q->overflow,
          q->released ? (double)q->late_sum_ns / (double)q->released / 1000.0 : 0.0,
          (double)q->late_max_ns / 1000.0, final ? "true" : "false");
  fclose(f);
  rename(tmp, path);
}

static void usage(void) {
  fprintf(stderr,
          "usage: tandem-emu-latency --delay-us D [--queue N] [--maxlen P] [--ready-file F]"
          " [--stats-file F] [--nice N] [--rt-priority P]\n");
}

static int parse_long(const char* name, const char* s, long lo, long hi, long* out) {
  char* end = NULL;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) {
    fprintf(stderr, "tandem-emu-latency: %s expects an integer in [%ld, %ld], got '%s'\n", name, lo, hi, s);
    return -1;
  }
  *out = v;
  return 0;
}

int main(int argc, char** argv) {
  long delay_us = -1, queue_num = 0, maxlen = 16384, nice_value = 0, rt_priority = 0;
  int set_nice = 0;
  const char* ready_file = NULL;
  const char* stats_file = NULL;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const char* v = (i + 1 < argc) ? argv[i + 1] : NULL;
    if (v == NULL) {
      fprintf(stderr, "tandem-emu-latency: option %s needs a value\n", a);
      usage();
      return 2;
    }
    int rc = 0;
    if (strcmp(a, "--delay-us") == 0) rc = parse_long(a, v, 0, 10000000, &delay_us);
    else if (strcmp(a, "--queue") == 0) rc = parse_long(a, v, 0, 65535, &queue_num);
    else if (strcmp(a, "--maxlen") == 0) rc = parse_long(a, v, 16, 1 << 20, &maxlen);
    else if (strcmp(a, "--nice") == 0) { rc = parse_long(a, v, -20, 19, &nice_value); set_nice = 1; }
    else if (strcmp(a, "--rt-priority") == 0) rc = parse_long(a, v, 0, 99, &rt_priority);
    else if (strcmp(a, "--ready-file") == 0) ready_file = v;
    else if (strcmp(a, "--stats-file") == 0) stats_file = v;
    else {
      fprintf(stderr, "tandem-emu-latency: unknown option %s\n", a);
      usage();
      return 2;
    }
    if (rc != 0) return 2;
    ++i;
  }
  if (delay_us < 0) {
    fprintf(stderr, "tandem-emu-latency: --delay-us is required\n");
    usage();
    return 2;
  }

  /* Sleep-timer precision matters more than the few wake-ups it costs. */
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  if (set_nice && setpriority(PRIO_PROCESS, 0, (int)nice_value) != 0)
    fprintf(stderr, "tandem-emu-latency: setpriority(%ld) failed: %s (continuing)\n", nice_value, strerror(errno));
  if (rt_priority > 0) {
    struct sched_param sp;
    memset(&sp, 0, sizeof sp);
    sp.sched_priority = (int)rt_priority;
    if (sched_setscheduler(0, SCHED_FIFO, &sp) != 0)
      fprintf(stderr, "tandem-emu-latency: SCHED_FIFO %ld failed: %s (continuing under CFS)\n", rt_priority,
              strerror(errno));
  }

  delay_queue q;
  memset(&q, 0, sizeof q);
  q.capacity = 1;
  while (q.capacity < (uint32_t)maxlen) q.capacity <<= 1;
  q.ring = calloc(q.capacity, sizeof(held_packet));
  if (q.ring == NULL) {
    fprintf(stderr, "tandem-emu-latency: cannot allocate a ring of %u packets\n", q.capacity);
    return 1;
  }
  q.delay_ns = (int64_t)delay_us * 1000;

  struct nfq_handle* h = nfq_open();
  if (h == NULL) {
    fprintf(stderr, "tandem-emu-latency: nfq_open failed: %s (needs CAP_NET_ADMIN)\n", strerror(errno));
    return 1;
  }
  nfq_unbind_pf(h, AF_INET); /* only needed on old kernels; harmless elsewhere */
  if (nfq_bind_pf(h, AF_INET) < 0)
    fprintf(stderr, "tandem-emu-latency: nfq_bind_pf: %s (ignored on kernels >= 3.8)\n", strerror(errno));
  q.qh = nfq_create_queue(h, (uint16_t)queue_num, on_packet, &q);
  if (q.qh == NULL) {
    fprintf(stderr, "tandem-emu-latency: cannot bind queue %ld: %s (is another program bound to it?)\n",
            queue_num, strerror(errno));
    nfq_close(h);
    return 1;
  }
  if (nfq_set_mode(q.qh, NFQNL_COPY_META, 0) < 0 && nfq_set_mode(q.qh, NFQNL_COPY_PACKET, 64) < 0) {
    fprintf(stderr, "tandem-emu-latency: nfq_set_mode failed: %s\n", strerror(errno));
    nfq_destroy_queue(q.qh);
    nfq_close(h);
    return 1;
  }
  if (nfq_set_queue_maxlen(q.qh, q.capacity) < 0)
    fprintf(stderr, "tandem-emu-latency: nfq_set_queue_maxlen(%u) failed: %s\n", q.capacity, strerror(errno));
  /* GSO: no segmentation just to queue us metadata. FAIL_OPEN: a full kernel queue passes packets
   * undelayed instead of dropping them (counted by the kernel, not here). */
  uint32_t flags = NFQA_CFG_F_GSO | NFQA_CFG_F_FAIL_OPEN;
  if (nfq_set_queue_flags(q.qh, flags, flags) < 0)
    fprintf(stderr, "tandem-emu-latency: nfq_set_queue_flags failed: %s (continuing)\n", strerror(errno));

  int fd = nfq_fd(h);
  nfnl_rcvbufsiz(nfq_nfnlh(h), 8u << 20);
  int one = 1;
  setsockopt(fd, SOL_NETLINK, NETLINK_NO_ENOBUFS, &one, sizeof one);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);

  /* Signals are blocked except inside ppoll, so a stop request always wakes the loop. */
  sigset_t block, wait_mask;
  sigemptyset(&block);
  sigaddset(&block, SIGTERM);
  sigaddset(&block, SIGINT);
  sigaddset(&block, SIGHUP);
  sigprocmask(SIG_BLOCK, &block, &wait_mask);
  sigdelset(&wait_mask, SIGTERM);
  sigdelset(&wait_mask, SIGINT);
  sigdelset(&wait_mask, SIGHUP);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);

  write_stats(stats_file, &q, 0);
  if (ready_file != NULL) {
    FILE* f = fopen(ready_file, "w");
    if (f != NULL) {
      fprintf(f, "%ld\n", (long)getpid());
      fclose(f);
    }
  }

  static char buf[65536] __attribute__((aligned(8)));
  int64_t next_stats = now_ns() + 1000000000;
  while (!g_stop) {
    int64_t wait_ns = release_due(&q);
    int64_t until_stats = next_stats - now_ns();
    if (until_stats <= 0) {
      write_stats(stats_file, &q, 0);
      next_stats = now_ns() + 1000000000;
      until_stats = 1000000000;
    }
    if (wait_ns < 0 || wait_ns > until_stats) wait_ns = until_stats;
    struct timespec ts = {(time_t)(wait_ns / 1000000000), (long)(wait_ns % 1000000000)};
    struct pollfd pfd = {fd, POLLIN, 0};
    int pr = ppoll(&pfd, 1, &ts, &wait_mask);
    if (pr < 0) {
      if (errno == EINTR) continue;
      fprintf(stderr, "tandem-emu-latency: ppoll: %s\n", strerror(errno));
      break;
    }
    if (pr == 0) continue;
    /* Bounded, so a steady stream of arrivals cannot hold back the release of due packets. */
    for (int k = 0; k < 64; ++k) {
      ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
        if (errno == ENOBUFS) continue; /* lost notifications: those packets fail open */
        fprintf(stderr, "tandem-emu-latency: recv: %s\n", strerror(errno));
        g_stop = 1;
        break;
      }
      nfq_handle_packet(h, buf, (int)n);
    }
  }
  /* Release everything still held so no connection stalls after we stop. */
  g_stop = 1;
  release_due(&q);
  write_stats(stats_file, &q, 1);
  nfq_destroy_queue(q.qh);
  nfq_close(h);
  free(q.ring);
  return 0;
}
