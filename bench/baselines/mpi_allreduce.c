/*
 * mpi_allreduce: baseline float32 SUM MPI_Allreduce benchmark (Debian Open MPI
 * 4.1.4), meant to be launched by run.sh as
 *
 *   mpirun --allow-run-as-root --oversubscribe -np N \
 *          --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo \
 *          --mca oob_tcp_if_include lo \
 *          mpi_allreduce SIZE_BYTES [SIZE_BYTES ...]
 *
 * i.e. point-to-point over the ob1 PML and the TCP BTL on loopback only (no
 * vader/shared-memory BTL, no UCX), and as
 *
 *   mpirun ... --mca pml ob1 --mca btl vader,self ... \
 *          mpi_allreduce --impl mpi-shm SIZE_BYTES [SIZE_BYTES ...]
 *
 * over shared memory instead (--impl only names the JSON "impl" field and the
 * stderr lines; the transport is mpirun's choice). The allreduce is in place (MPI_IN_PLACE),
 * like a gradient allreduce; the collective algorithm is whatever Open MPI's
 * default "tuned" coll component picks for the size and rank count.
 *
 * Per size: allocate, warm up, then repeat { refill the buffer (untimed),
 * MPI_Barrier, time one MPI_Allreduce, MAX-reduce that time across ranks
 * (untimed) } for at least 5 iterations and until ~2 s of wall time (at most
 * 2000). Rank 0 prints one JSON line with the median of the per-iteration
 * maxima. The result of the last timed iteration is checked on every rank.
 */

#include <mpi.h>

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TARGET_SECONDS 2.0
#define MIN_ITERS 5
#define MAX_ITERS 2000

static int g_rank = -1;
static const char *g_impl = "mpi";

static void die(const char *msg) {
  fprintf(stderr, "mpi_allreduce: rank %d: %s\n", g_rank, msg);
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  exit(1);
}

/* Small multiples of 0.5: the sum over ranks is exact in float32 whatever
 * the reduction order. */
static inline float fill_value(int rank, size_t i) {
  return (float)((i * 7 + (size_t)rank * 13) % 64) * 0.5f;
}

static void fill(float *buf, size_t n, int rank) {
  for (size_t i = 0; i < n; i++) buf[i] = fill_value(rank, i);
}

static void verify(const float *buf, size_t n, int world, size_t bytes) {
  for (size_t i = 0; i < n; i++) {
    float want = 0.0f;
    for (int r = 0; r < world; r++) want += fill_value(r, i);
    if (buf[i] != want) {
      char msg[256];
      snprintf(msg, sizeof(msg),
               "wrong result for size %zu at element %zu: got %.9g want %.9g",
               bytes, i, (double)buf[i], (double)want);
      die(msg);
    }
  }
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof(double), cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void bench_size(size_t bytes, int rank, int world) {
  if (bytes == 0 || bytes % sizeof(float) != 0) die("size must be a positive multiple of 4");
  const size_t n = bytes / sizeof(float);
  if (n > (size_t)0x7fffffff) die("size too large for an int count");

  float *buf = aligned_alloc(64, bytes);
  double *times = malloc(sizeof(double) * MAX_ITERS);
  if (buf == NULL || times == NULL) die("out of memory");

  const int warmups = bytes >= (16u << 20) ? 2 : 5;
  for (int w = 0; w < warmups; w++) {
    fill(buf, n, rank);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }

  /* stat = {this iteration's time, wall time since the timed phase began},
   * MAX-reduced so that every rank takes the same stop decision. */
  int iters = 0;
  const double phase_start = MPI_Wtime();
  for (;;) {
    double stat[2];
    fill(buf, n, rank); /* untimed: every iteration reduces the same input */
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double t1 = MPI_Wtime();
    stat[0] = t1 - t0;
    stat[1] = t1 - phase_start;
    MPI_Allreduce(MPI_IN_PLACE, stat, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    times[iters++] = stat[0];
    if (iters >= MAX_ITERS || (iters >= MIN_ITERS && stat[1] >= TARGET_SECONDS)) break;
  }
  verify(buf, n, world, bytes); /* result of the last timed iteration */

  if (rank == 0) {
    double med = median(times, iters); /* sorts times */
#define PCT(q) times[(int)((q) * (iters - 1) + 0.5)]
    fprintf(stderr,
            "[%s] ranks=%d size=%zu iters=%d min=%.3gs p10=%.3gs p50=%.3gs "
            "p90=%.3gs max=%.3gs\n",
            g_impl, world, bytes, iters, times[0], PCT(0.1), PCT(0.5), PCT(0.9),
            times[iters - 1]);
#undef PCT
    double algbw = (double)bytes / med / 1e9;
    double busbw = algbw * 2.0 * (world - 1) / world;
    printf("{\"impl\":\"%s\",\"size_bytes\":%zu,\"ranks\":%d,\"iters\":%d,"
           "\"median_s\":%.9g,\"algbw_gbps\":%.6g,\"busbw_gbps\":%.6g}\n",
           g_impl, bytes, world, iters, med, algbw, busbw);
    fflush(stdout);
  }
  free(times);
  free(buf);
}

int main(int argc, char **argv) {
  int world;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  int first = 1;
  if (argc > 2 && strcmp(argv[1], "--impl") == 0) {
    for (const char *c = argv[2]; *c; c++) { /* printed inside a JSON string */
      if (!(isalnum((unsigned char)*c) || *c == '-' || *c == '_')) die("--impl: letters, digits, - and _ only");
    }
    g_impl = argv[2];
    first = 3;
  }
  if (argc <= first) die("usage: mpi_allreduce [--impl NAME] SIZE_BYTES [SIZE_BYTES ...]");

  for (int a = first; a < argc; a++) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(argv[a], &end, 10);
    if (errno != 0 || end == argv[a] || *end != '\0' || v <= 0) die("bad size argument");
    bench_size((size_t)v, g_rank, world);
  }

  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Finalize();
  return 0;
}
