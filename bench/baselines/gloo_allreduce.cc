// gloo_allreduce: baseline float32 SUM allreduce benchmark using Gloo
// (Debian libgloo-dev 0.0~git20220518) over its TCP transport on loopback.
//
// Usage (one process per rank, all on this machine):
//   gloo_allreduce --rank R --world N --store DIR [--algo ring|bcube|ring_chunked]
//                  [--addr IP] SIZE_BYTES [SIZE_BYTES ...]
//
// Rendezvous goes through gloo::rendezvous::FileStore rooted at DIR, which
// must be an empty directory shared by all ranks (fresh per run). Every rank
// binds its TCP device to 127.0.0.1 only, or to --addr (run.sh's cross-host
// mode: the rank's network namespace's address on the veth network).
//
// Algorithm: by default we call gloo::allreduce(AllreduceOptions) without
// setting an algorithm, with an in-place output buffer and gloo::sum<float> as
// the reduce function. That is exactly what PyTorch's ProcessGroupGloo does for
// a dense CPU float SUM allreduce (AsyncAllreduceWork::allreduce), and in this
// gloo version AllreduceOptions::UNSPECIFIED dispatches to the RING
// implementation in gloo/allreduce.cc: a bandwidth-optimal ring
// reduce-scatter + allgather, pipelined in segments of at most 1 MiB with two
// I/O operations in flight. For comparison, --algo bcube selects the BCUBE
// path of the same entry point and --algo ring_chunked the legacy
// gloo::AllreduceRingChunked<float> class (impl names "gloo_bcube" and
// "gloo_ring_chunked" in the JSON output).
//
// Per size: allocate, warm up, then repeat { refill the buffer (untimed),
// barrier, time one allreduce, MAX-reduce that time across ranks (untimed) }
// for at least 5 iterations and until ~2 s of wall time (at most 2000).
// Rank 0 prints one JSON line with the median of the per-iteration maxima.
// The result of the last timed iteration is checked element by element on
// every rank.

#include <gloo/allreduce.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

namespace {

constexpr double kTargetSeconds = 2.0;  // rough timed budget per size
constexpr int kMinIters = 5;
constexpr int kMaxIters = 2000;

enum class Algo { Ring, Bcube, RingChunked };

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "gloo_allreduce: %s\n", msg.c_str());
  std::exit(1);
}

[[noreturn]] void usage() {
  die("usage: gloo_allreduce --rank R --world N --store DIR [--addr IP] "
      "[--algo ring|bcube|ring_chunked] SIZE_BYTES...");
}

long parseLong(const char* s, const char* what) {
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0') {
    die(std::string("bad ") + what + ": " + s);
  }
  return v;
}

// Deterministic fill: small multiples of 0.5 so that the sum over ranks is
// exact in float32 regardless of the reduction order.
inline float fillValue(int rank, size_t i) {
  return static_cast<float>((i * 7 + static_cast<size_t>(rank) * 13) % 64) *
      0.5f;
}

void fill(float* buf, size_t n, int rank) {
  for (size_t i = 0; i < n; i++) {
    buf[i] = fillValue(rank, i);
  }
}

void verify(const float* buf, size_t n, int world, int rank, size_t bytes) {
  for (size_t i = 0; i < n; i++) {
    float want = 0.0f;
    for (int r = 0; r < world; r++) {
      want += fillValue(r, i);
    }
    if (buf[i] != want) {
      char msg[256];
      std::snprintf(
          msg, sizeof(msg),
          "rank %d: wrong result for size %zu at element %zu: got %.9g want %.9g",
          rank, bytes, i, static_cast<double>(buf[i]),
          static_cast<double>(want));
      die(msg);
    }
  }
}

double now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void barrier(const std::shared_ptr<gloo::Context>& ctx) {
  gloo::BarrierOptions opts(ctx);
  opts.setTag(1);
  gloo::barrier(opts);
}

// Element-wise MAX of a double vector across ranks (in place).
void allreduceMax(const std::shared_ptr<gloo::Context>& ctx,
                  std::vector<double>& v) {
  gloo::AllreduceOptions opts(ctx);
  opts.setOutput(v.data(), v.size());
  opts.setReduceFunction(
      static_cast<void (*)(void*, const void*, const void*, size_t)>(
          &gloo::max<double>));
  opts.setTag(2);
  gloo::allreduce(opts);
}

// Runs one float32 SUM allreduce of buf in place with the chosen algorithm.
class Runner {
 public:
  Runner(std::shared_ptr<gloo::Context> ctx, Algo algo, float* buf, size_t n)
      : ctx_(std::move(ctx)), algo_(algo), buf_(buf), n_(n) {
    if (algo_ == Algo::RingChunked) {
      std::vector<float*> ptrs{buf_};
      legacy_ = std::make_unique<gloo::AllreduceRingChunked<float>>(
          ctx_, ptrs, static_cast<int>(n_));
    }
  }

  void run() {
    if (legacy_) {
      legacy_->run();
      return;
    }
    gloo::AllreduceOptions opts(ctx_);
    if (algo_ == Algo::Bcube) {
      opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::BCUBE);
    }  // Ring: leave UNSPECIFIED, as ProcessGroupGloo does (-> RING).
    opts.setOutput(buf_, n_);
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(
            &gloo::sum<float>));
    opts.setTag(3);
    gloo::allreduce(opts);
  }

 private:
  std::shared_ptr<gloo::Context> ctx_;
  Algo algo_;
  float* buf_;
  size_t n_;
  std::unique_ptr<gloo::AllreduceRingChunked<float>> legacy_;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

void benchSize(const std::shared_ptr<gloo::Context>& ctx, Algo algo,
               const char* implName, size_t bytes) {
  const int rank = ctx->rank;
  const int world = ctx->size;
  if (bytes == 0 || bytes % sizeof(float) != 0) {
    die("size must be a positive multiple of 4 bytes: " +
        std::to_string(bytes));
  }
  const size_t n = bytes / sizeof(float);
  if (algo == Algo::RingChunked && n > static_cast<size_t>(INT32_MAX)) {
    die("ring_chunked takes an int element count");
  }

  float* buf = static_cast<float*>(std::aligned_alloc(64, bytes));
  if (buf == nullptr) {
    die("out of memory allocating " + std::to_string(bytes) + " bytes");
  }
  fill(buf, n, rank);
  Runner runner(ctx, algo, buf, n);

  // Warmup (untimed, not recorded).
  const int warmups = bytes >= (16u << 20) ? 2 : 5;
  for (int w = 0; w < warmups; w++) {
    fill(buf, n, rank);
    barrier(ctx);
    runner.run();
  }

  // Timed phase. After each iteration, a tiny MAX-allreduce (outside the
  // timed region) yields {this iteration's max time over ranks, max wall
  // time since the timed phase began}; every rank then sees identical
  // numbers and stops at the same iteration: at least kMinIters, then until
  // kTargetSeconds of wall time or kMaxIters.
  std::vector<double> times;
  std::vector<double> stat(2, 0.0);
  const double phaseStart = now();
  for (;;) {
    fill(buf, n, rank);  // untimed: every iteration reduces the same input
    barrier(ctx);
    double t0 = now();
    runner.run();
    double t1 = now();
    stat[0] = t1 - t0;
    stat[1] = t1 - phaseStart;
    allreduceMax(ctx, stat);
    times.push_back(stat[0]);
    int done = static_cast<int>(times.size());
    if (done >= kMaxIters ||
        (done >= kMinIters && stat[1] >= kTargetSeconds)) {
      break;
    }
  }
  const int iters = static_cast<int>(times.size());
  verify(buf, n, world, rank, bytes);  // result of the last timed iteration

  if (rank == 0) {
    std::vector<double> sorted = times;
    std::sort(sorted.begin(), sorted.end());
    auto pct = [&](double q) {
      return sorted[static_cast<size_t>(q * (sorted.size() - 1) + 0.5)];
    };
    std::fprintf(stderr,
                 "[%s] ranks=%d size=%zu iters=%d min=%.3gs p10=%.3gs "
                 "p50=%.3gs p90=%.3gs max=%.3gs\n",
                 implName, world, bytes, iters, sorted.front(), pct(0.1),
                 pct(0.5), pct(0.9), sorted.back());
    double med = median(times);
    double algbw = static_cast<double>(bytes) / med / 1e9;
    double busbw = algbw * 2.0 * (world - 1) / world;
    std::printf(
        "{\"impl\":\"%s\",\"size_bytes\":%zu,\"ranks\":%d,\"iters\":%d,"
        "\"median_s\":%.9g,\"algbw_gbps\":%.6g,\"busbw_gbps\":%.6g}\n",
        implName, bytes, world, iters, med, algbw, busbw);
    std::fflush(stdout);
  }
  std::free(buf);
}

}  // namespace

int main(int argc, char** argv) {
  int rank = -1;
  int world = -1;
  std::string storeDir;
  std::string algoName = "ring";
  std::string addr = "127.0.0.1";  // loopback only, unless run.sh names a veth address
  std::vector<size_t> sizes;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) usage();
      return argv[++i];
    };
    if (a == "--rank") {
      rank = static_cast<int>(parseLong(next(), "rank"));
    } else if (a == "--world") {
      world = static_cast<int>(parseLong(next(), "world"));
    } else if (a == "--store") {
      storeDir = next();
    } else if (a == "--addr") {
      addr = next();
    } else if (a == "--algo") {
      algoName = next();
    } else if (!a.empty() && a[0] == '-') {
      usage();
    } else {
      long v = parseLong(a.c_str(), "size");
      if (v <= 0) die("size must be positive");
      sizes.push_back(static_cast<size_t>(v));
    }
  }
  if (world < 1 || rank < 0 || rank >= world || storeDir.empty() ||
      sizes.empty()) {
    usage();
  }
  Algo algo;
  const char* implName;
  if (algoName == "ring") {
    algo = Algo::Ring;
    implName = "gloo";
  } else if (algoName == "bcube") {
    algo = Algo::Bcube;
    implName = "gloo_bcube";
  } else if (algoName == "ring_chunked") {
    algo = Algo::RingChunked;
    implName = "gloo_ring_chunked";
  } else {
    usage();
  }

  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = addr;
    attr.ai_family = AF_INET;
    auto dev = gloo::transport::tcp::CreateDevice(attr);

    gloo::rendezvous::FileStore store(storeDir);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, world);
    ctx->setTimeout(std::chrono::seconds(120));
    ctx->connectFullMesh(store, dev);
    std::shared_ptr<gloo::Context> base = ctx;

    for (size_t bytes : sizes) {
      benchSize(base, algo, implName, bytes);
    }
    barrier(base);
  } catch (const std::exception& e) {
    die(std::string("rank ") + std::to_string(rank) + ": " + e.what());
  }
  return 0;
}
