// The host SIMT emulator (see kvscout_simt/prelude.hpp): the fiber scheduler that runs a grid, and
// the subset of the CUDA runtime API that kvscout and its GPU tests call, so that those tests link
// and run without libcudart or a device.
//
// KVSCOUT_SIMT_ORDER picks the order in which the threads of a block run between barriers:
// `forward` (thread 0 first; the default), `reverse`, or `shuffle[:SEED]` (a new seeded order for
// every round). ctest runs every emulated test forward and reverse: a read that lacks its barrier
// sees stale data in one of the two whichever thread writes.

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <new>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kvscout_simt/prelude.hpp"

// ---- the opaque handle types of the runtime, completed here ---------------------------------------
// A capture's "clock" of a stream: how many of the capture's operations, counted when each was
// enqueued, a stream has seen complete (its own, and through event waits, other streams').
using capture_clock = std::map<CUstream_st*, std::size_t>;

struct CUevent_st;

// One operation waiting in a stream: work (a kernel, a copy), an event record, or a wait for one.
struct stream_op {
  std::function<void()> work;
  CUevent_st* record = nullptr;  // completes this record of the event
  CUevent_st* wait = nullptr;    // runnable once this record of the event has completed
  unsigned long long generation = 0;
};

struct CUstream_st {
  unsigned long long id = 0;  // creation order: the thread-order setting orders streams by it
  bool capturing = false;
  bool non_blocking = false;
  capture_clock clock;  // while capturing
  std::deque<stream_op> queue;  // enqueued, not yet run
};
struct CUevent_st {
  unsigned long long captured_in = 0;  // the capture it was last recorded in (0: none)
  capture_clock clock;                 // the recording stream's clock at the record
  unsigned long long recorded = 0;     // records enqueued
  unsigned long long completed = 0;    // the latest record that has run
  std::chrono::steady_clock::time_point at{};  // ... when it ran (for cudaEventElapsedTime)
};
struct CUgraph_st {
  std::vector<std::function<void()>> ops;
};
struct CUgraphExec_st {
  std::vector<std::function<void()>> ops;
};

namespace kvscout_simt::detail {
namespace {

[[noreturn]] void fatal(const std::string& what) {
  std::fprintf(stderr, "simt: %s\n", what.c_str());
  std::abort();
}

// ---- fibers -------------------------------------------------------------------------------------
// On x86-64 a fiber switch saves the callee-saved registers and the FP control words on the old
// stack and swaps stack pointers (no system call, unlike swapcontext, which also switches the
// signal mask); AddressSanitizer is told of each switch. Elsewhere, ucontext. Under the test
// build's sanitizers the emulator itself is compiled uninstrumented into instrumented programs
// (KVSCOUT_SIMT_ASAN_RUNTIME, tests/simt/CMakeLists.txt): it still makes those calls.
#if defined(__x86_64__)
#define KVSCOUT_SIMT_ASM_SWITCH 1
#else
#define KVSCOUT_SIMT_ASM_SWITCH 0
#endif
#if (defined(__SANITIZE_ADDRESS__) || defined(KVSCOUT_SIMT_ASAN_RUNTIME)) && KVSCOUT_SIMT_ASM_SWITCH
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define KVSCOUT_SIMT_ASAN 1
#else
#define KVSCOUT_SIMT_ASAN 0
#endif

constexpr std::size_t stack_bytes = 256 * 1024;  // usable; one more page below is a guard

#if KVSCOUT_SIMT_ASM_SWITCH
// kvscout_simt_switch(&save, next): pushes rbp, rbx, r12-r15 and the MXCSR / x87 control words,
// stores the stack pointer in *save, loads `next` and pops the same from there.
extern "C" void kvscout_simt_switch(void** save, void* next);
asm(R"(
  .text
  .p2align 4
  .globl kvscout_simt_switch
  .hidden kvscout_simt_switch
  .type kvscout_simt_switch, @function
kvscout_simt_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size kvscout_simt_switch, .-kvscout_simt_switch
)");
#endif

/// A fiber stack with a PROT_NONE guard page below it: an overflow faults instead of corrupting.
class fiber_stack {
 public:
  fiber_stack() {
    page_ = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    void* p = mmap(nullptr, stack_bytes + page_, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) fatal("could not map a fiber stack");
    mprotect(p, page_, PROT_NONE);
    base_ = static_cast<char*>(p);
  }
  fiber_stack(const fiber_stack&) = delete;
  fiber_stack& operator=(const fiber_stack&) = delete;
  ~fiber_stack() { munmap(base_, stack_bytes + page_); }
  char* bottom() const { return base_ + page_; }

 private:
  char* base_ = nullptr;
  std::size_t page_ = 0;
};

struct fiber {
#if KVSCOUT_SIMT_ASM_SWITCH
  void* sp = nullptr;
  void* fake_stack = nullptr;  // AddressSanitizer's, while switched out
#else
  ucontext_t ctx{};
#endif
  std::unique_ptr<fiber_stack> stack;
  thread_state state{};
  unsigned linear = 0;
  bool done = false;
  unsigned warp_ops = 0;  // shuffles done so far: the parity picks the exchange buffer
};

struct warp_state {
  unsigned lanes = 0;      // the lanes this warp has (a block's last warp may be partial)
  unsigned exited = 0;     // lanes that have returned
  unsigned arrived = 0;    // lanes waiting at the pending shuffle
  unsigned mask = 0;       // the pending shuffle's mask
  const char* site = nullptr;
  unsigned long long gen = 0;
  std::uint64_t values[2][32] = {};
};

struct block_run {
  const std::function<void()>* body = nullptr;
  std::vector<fiber>* fibers = nullptr;
  unsigned count = 0;  // threads in the block
  unsigned live = 0;
  unsigned arrived = 0;
  unsigned long long gen = 0;
  int acc_or = 0, acc_count = 0;
  int result_or[2] = {0, 0}, result_count[2] = {0, 0};
  const char* site = nullptr;  // the __syncthreads the first arrival of this generation waits at
  bool collective = false;     // the barrier is inside a CUB collective: no thread may be missing
  std::vector<warp_state> warps;
  std::vector<unsigned char> dynamic;
#if KVSCOUT_SIMT_ASM_SWITCH
  void* scheduler = nullptr;
#else
  ucontext_t scheduler{};
#endif
  fiber* current = nullptr;
  unsigned long long progress = 0;
};

block_run* g_block = nullptr;
std::vector<fiber> g_fibers;  // reused between launches (the stacks are the cost)
#if KVSCOUT_SIMT_ASAN
const void* g_scheduler_bottom = nullptr;  // the scheduler's stack, as AddressSanitizer reports it
std::size_t g_scheduler_size = 0;
void* g_scheduler_fake = nullptr;
#endif

// ---- the order threads run in ---------------------------------------------------------------------
enum class order_kind { forward, reverse, shuffle };
struct order_setting {
  order_kind kind = order_kind::forward;
  std::mt19937 rng{1};
};
order_setting parse_order(const std::string& v) {
    order_setting s;
    if (v == "forward") {
      s.kind = order_kind::forward;
    } else if (v == "reverse") {
      s.kind = order_kind::reverse;
    } else if (v.rfind("shuffle", 0) == 0) {
      s.kind = order_kind::shuffle;
      if (v.size() > 8 && v[7] == ':') s.rng.seed(static_cast<unsigned>(std::stoul(v.substr(8))));
    } else {
      fatal("the thread order is '" + v + "'; expected forward, reverse or shuffle[:SEED]");
    }
    return s;
}
order_setting& order() {
  static order_setting o = [] {
    const char* env = std::getenv("KVSCOUT_SIMT_ORDER");
    return parse_order(env != nullptr ? env : "forward");
  }();
  return o;
}

// From a fiber to the scheduler, and back.
void yield() {
#if KVSCOUT_SIMT_ASM_SWITCH
  fiber& f = *g_block->current;
#if KVSCOUT_SIMT_ASAN
  __sanitizer_start_switch_fiber(&f.fake_stack, g_scheduler_bottom, g_scheduler_size);
#endif
  kvscout_simt_switch(&f.sp, g_block->scheduler);
#if KVSCOUT_SIMT_ASAN
  __sanitizer_finish_switch_fiber(f.fake_stack, &g_scheduler_bottom, &g_scheduler_size);
#endif
#else
  swapcontext(&g_block->current->ctx, &g_block->scheduler);
#endif
}

// From the scheduler into a fiber, until it yields or ends.
void resume(fiber& f) {
  g_block->current = &f;
#if KVSCOUT_SIMT_ASM_SWITCH
#if KVSCOUT_SIMT_ASAN
  __sanitizer_start_switch_fiber(&g_scheduler_fake, f.stack->bottom(), stack_bytes);
#endif
  kvscout_simt_switch(&g_block->scheduler, f.sp);
#if KVSCOUT_SIMT_ASAN
  __sanitizer_finish_switch_fiber(g_scheduler_fake, nullptr, nullptr);
#endif
#else
  swapcontext(&g_block->scheduler, &f.ctx);
#endif
}

void release_block(block_run& b) {
  if (b.collective && b.live != b.count)
    fatal(std::string("a CUB block primitive ran after threads of the block returned (") + b.site + ")");
  b.collective = false;
  b.result_or[b.gen & 1] = b.acc_or;
  b.result_count[b.gen & 1] = b.acc_count;
  b.acc_or = 0;
  b.acc_count = 0;
  b.arrived = 0;
  b.site = nullptr;
  ++b.gen;
  ++b.progress;
}

void release_warp(block_run& b, warp_state& w) {
  w.arrived = 0;
  w.mask = 0;
  w.site = nullptr;
  ++w.gen;
  ++b.progress;
}

void fiber_entry() {
#if KVSCOUT_SIMT_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &g_scheduler_bottom, &g_scheduler_size);
#endif
  block_run& b = *g_block;
  (*b.body)();
  fiber& f = *b.current;
  f.done = true;
  ++b.progress;
  --b.live;
  if (b.arrived > 0 && b.arrived == b.live) release_block(b);
  warp_state& w = b.warps[f.linear / 32];
  if (w.arrived > 0 && ((w.mask >> (f.linear % 32)) & 1u))
    fatal("a thread exited while other threads of its warp wait at a shuffle (" +
          std::string(w.site) + ") whose mask names it");
  w.exited |= 1u << (f.linear % 32);
#if KVSCOUT_SIMT_ASM_SWITCH
#if KVSCOUT_SIMT_ASAN
  __sanitizer_start_switch_fiber(nullptr, g_scheduler_bottom, g_scheduler_size);  // stack is done
#endif
  // Never comes back: the fiber is done. f.sp keeps its last stack pointer, the bottom of the
  // frames that stay poisoned (start_fiber unpoisons from there up).
  kvscout_simt_switch(&f.sp, b.scheduler);
  std::abort();
#endif
  // ucontext: returning resumes uc_link, the scheduler
}

// A fiber's first stack: the frame kvscout_simt_switch pops, returning into fiber_entry as if
// it had been called (the stack 16-byte aligned before the call).
void start_fiber(fiber& f, block_run& b) {
  const bool fresh = !f.stack;
  if (fresh) f.stack = std::make_unique<fiber_stack>();
#if KVSCOUT_SIMT_ASM_SWITCH
  (void)b;
  auto top = reinterpret_cast<std::uintptr_t>(f.stack->bottom() + stack_bytes) & ~std::uintptr_t{15};
#if KVSCOUT_SIMT_ASAN
  // The frames of the fiber that used this stack before were never popped (it switched away
  // from fiber_entry for good): their redzones are still poisoned. Every frame below its last
  // stack pointer returned, and a returning frame unpoisons itself, so only the part above needs
  // clearing: a few hundred bytes instead of the whole stack's shadow (32 KiB of memset per
  // thread per block, a fifth of the sanitized emulator's time). A fresh stack: all of it.
  const auto from = fresh ? reinterpret_cast<std::uintptr_t>(f.stack->bottom())
                         : reinterpret_cast<std::uintptr_t>(f.sp) & ~std::uintptr_t{7};
  const auto end = reinterpret_cast<std::uintptr_t>(f.stack->bottom() + stack_bytes);
  ASAN_UNPOISON_MEMORY_REGION(reinterpret_cast<void*>(from), end - from);
#endif
  auto* words = reinterpret_cast<std::uint64_t*>(top);
  words[-1] = 0;                                               // fiber_entry's "return address"
  words[-2] = reinterpret_cast<std::uint64_t>(&fiber_entry);   // where the switch returns to
  for (int i = 3; i <= 8; ++i) words[-i] = 0;                  // rbp, rbx, r12 .. r15
  std::uint32_t mxcsr = 0;
  std::uint16_t fcw = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fcw));
  words[-9] = static_cast<std::uint64_t>(mxcsr) | (static_cast<std::uint64_t>(fcw) << 32);
  f.sp = &words[-9];
#else
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = f.stack->bottom();
  f.ctx.uc_stack.ss_size = stack_bytes;
  f.ctx.uc_link = &b.scheduler;
  makecontext(&f.ctx, fiber_entry, 0);
#endif
}

// Block-wide barrier: returns the generation it waited for. Even the thread that completes the
// barrier yields, so that after every barrier the threads go on in the order setting's order.
unsigned long long block_barrier(const char* site) {
  if (g_block == nullptr) fatal("__syncthreads called outside a kernel");
  block_run& b = *g_block;
  if (b.site == nullptr) {
    b.site = site;
  } else if (b.site != site && std::strcmp(b.site, site) != 0) {
    fatal(std::string("threads of one block wait at different barriers: ") + b.site + " and " + site);
  }
  const unsigned long long mine = b.gen;
  ++b.arrived;
  ++b.progress;
  if (b.arrived == b.live) release_block(b);
  do yield();
  while (b.gen == mine);
  return mine;
}

// The lane a shuffle reads (PTX shfl.bfly / shfl.idx with a segment of `width` lanes).
int xor_source(int lane, int lane_mask, int width) {
  const int first = lane & ~(width - 1);
  const int src = lane ^ lane_mask;
  return src <= first + width - 1 ? src : lane;  // past the segment: the lane's own value
}
int direct_source(int lane, int src_lane, int width) {
  return (lane & ~(width - 1)) | (src_lane & (width - 1));
}

std::uint64_t warp_exchange(unsigned mask, std::uint64_t bits, bool butterfly, int arg, int width,
                            const char* site) {
  if (g_block == nullptr) fatal("a warp shuffle called outside a kernel");
  block_run& b = *g_block;
  fiber& f = *b.current;
  const unsigned warp = f.linear / 32;
  const int lane = static_cast<int>(f.linear % 32);
  warp_state& w = b.warps[warp];
  const unsigned have = w.lanes & ~w.exited;
  if (width <= 0 || width > 32 || (width & (width - 1)) != 0)
    fatal("a shuffle's width must be a power of two <= 32");
  if (!((mask >> lane) & 1u)) fatal(std::string("a lane calls a shuffle whose mask leaves it out: ") + site);
  if ((mask & have) != mask)
    fatal(std::string("a shuffle's mask names lanes that have exited or do not exist: ") + site);
  if (w.arrived == 0) {
    w.mask = mask;
    w.site = site;
  } else if (w.mask != mask || (w.site != site && std::strcmp(w.site, site) != 0)) {
    fatal(std::string("lanes of a warp wait at different shuffles (or masks): ") + w.site + " and " + site);
  }
  const unsigned parity = f.warp_ops++ & 1u;
  w.values[parity][lane] = bits;
  const unsigned long long mine = w.gen;
  ++w.arrived;
  ++b.progress;
  if (w.arrived == static_cast<unsigned>(std::popcount(mask))) release_warp(b, w);
  do yield();
  while (w.gen == mine);
  const int src = butterfly ? xor_source(lane, arg, width) : direct_source(lane, arg, width);
  if (!((mask >> src) & 1u)) fatal(std::string("a shuffle reads a lane its mask leaves out: ") + site);
  return w.values[parity][src];
}

// ---- the runtime's state -------------------------------------------------------------------------
thread_local cudaError_t g_last_error = cudaSuccess;

cudaError_t set_error(cudaError_t e) {
  if (e != cudaSuccess) g_last_error = e;
  return e;
}

enum class memory_kind { device, host_mapped, host };
struct allocation {
  std::size_t bytes;
  memory_kind kind;
};
// Never destroyed: a program's static objects may free device or pinned memory in their
// destructors at exit (bench_fetch_attention's fixtures do), after a function-local map made at
// the first allocation would be gone.
std::map<const unsigned char*, allocation>& allocations() {
  static auto* m = new std::map<const unsigned char*, allocation>;
  return *m;
}
const std::pair<const unsigned char* const, allocation>* find_allocation(const void* p) {
  auto& m = allocations();
  const auto* c = static_cast<const unsigned char*>(p);
  auto it = m.upper_bound(c);
  if (it == m.begin()) return nullptr;
  --it;
  return c < it->first + std::max<std::size_t>(it->second.bytes, 1) ? &*it : nullptr;
}

// 256-byte alignment, as cudaMalloc gives; ASan still sees the allocation's bounds. Null where a
// device could not hold it (more than an H200's 141 GB) or the host cannot.
void* allocate(std::size_t bytes, memory_kind kind) {
  if (kind == memory_kind::device && bytes > std::size_t{141'000'000'000}) return nullptr;
  void* p = ::operator new(std::max<std::size_t>(bytes, 1), std::align_val_t{256}, std::nothrow);
  if (p != nullptr) allocations()[static_cast<const unsigned char*>(p)] = allocation{bytes, kind};
  return p;
}

cudaError_t release(void* p, bool host) {
  if (p == nullptr) return cudaSuccess;
  auto& m = allocations();
  auto it = m.find(static_cast<const unsigned char*>(p));
  if (it == m.end() || (it->second.kind == memory_kind::device) == host)
    return set_error(cudaErrorInvalidValue);
  m.erase(it);
  ::operator delete(p, std::align_val_t{256});
  return cudaSuccess;
}

struct capture_state {
  unsigned long long id = 0;
  CUstream_st* origin = nullptr;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::vector<CUstream_st*> streams;
  std::vector<std::function<void()>> ops;
  bool invalidated = false;
  bool all_non_blocking = true;  // of the capturing streams
};
std::unique_ptr<capture_state> g_capture;
unsigned long long g_capture_ids = 0;

bool is_legacy(cudaStream_t s) { return s == nullptr || s == cudaStreamLegacy; }
bool is_special(cudaStream_t s) { return is_legacy(s) || s == cudaStreamPerThread; }

bool stream_capturing(cudaStream_t s) { return g_capture && !is_special(s) && s->capturing; }

// An operation CUDA refuses while a capture is active: it invalidates the capture.
cudaError_t refuse_during_capture(cudaError_t e) {
  g_capture->invalidated = true;
  return set_error(e);
}

// An operation on the legacy stream while a capture is active: it would wait for the capturing
// streams unless they are all non-blocking.
bool legacy_conflicts_with_capture(cudaStream_t s) {
  return g_capture && is_legacy(s) && !g_capture->all_non_blocking;
}

// Potentially unsafe calls (allocation, synchronisation) are refused in the capturing thread,
// except in relaxed mode.
bool unsafe_refused() { return g_capture && g_capture->mode != cudaStreamCaptureModeRelaxed; }

void merge(capture_clock& into, const capture_clock& from) {
  for (const auto& [s, n] : from) into[s] = std::max(into[s], n);
}

// ---- streams: operations wait in their stream until the host synchronises -------------------------
// A stream runs nothing when work is enqueued. At a synchronisation point (a stream, event or
// device synchronize, a synchronous copy, a free, work on the legacy stream) the emulator runs
// queued operations, one stream at a time for as long as its next operation can run, choosing
// streams in the thread-order setting's order (forward: the earliest-created stream first;
// reverse: the latest; shuffle: at random). Event waits are honoured, nothing else: work that the
// code forgot to order runs in whichever order the setting gives, and one of forward and reverse
// exposes it.
std::vector<CUstream_st*> g_streams;  // live streams, in creation order
unsigned long long g_stream_ids = 0;

bool runnable(const stream_op& op) { return op.wait == nullptr || op.wait->completed >= op.generation; }

void run_op(CUstream_st* s) {
  stream_op op = std::move(s->queue.front());
  s->queue.pop_front();
  if (op.work) op.work();
  if (op.record != nullptr) {
    op.record->completed = std::max(op.record->completed, op.generation);
    op.record->at = std::chrono::steady_clock::now();
  }
}

// Runs queued operations until `done` holds; fatal if nothing can run before it does.
template <class Done>
void drain_until(Done done) {
  order_setting& ord = order();
  while (!done()) {
    std::vector<CUstream_st*> ready;
    for (CUstream_st* s : g_streams)
      if (!s->queue.empty() && runnable(s->queue.front())) ready.push_back(s);
    if (ready.empty()) fatal("streams wait on event records that never run (a wait on a later record?)");
    CUstream_st* s = ready.front();
    if (ord.kind == order_kind::reverse) s = ready.back();
    if (ord.kind == order_kind::shuffle) s = ready[std::uniform_int_distribution<std::size_t>(0, ready.size() - 1)(ord.rng)];
    while (!s->queue.empty() && runnable(s->queue.front()) && !done()) run_op(s);
  }
}

void drain_all() {
  drain_until([] {
    for (CUstream_st* s : g_streams)
      if (!s->queue.empty()) return false;
    return true;
  });
}

// RAII: the running block, reset however run_grid leaves.
struct block_scope {
  explicit block_scope(block_run* b) { g_block = b; }
  ~block_scope() { g_block = nullptr; }
  block_scope(const block_scope&) = delete;
  block_scope& operator=(const block_scope&) = delete;
};

}  // namespace

// ---- the scheduler --------------------------------------------------------------------------------
const thread_state& current() {
  if (g_block == nullptr) fatal("threadIdx / blockIdx read outside a kernel");
  return g_block->current->state;
}

void set_order(const char* setting) { order() = parse_order(setting); }

bool block_intact() { return g_block != nullptr && g_block->live == g_block->count; }

void* dynamic_shared() {
  if (g_block == nullptr) fatal("dynamic shared memory used outside a kernel");
  return g_block->dynamic.data();
}

void syncthreads(const char* site) { (void)block_barrier(site); }

void collective_syncthreads(const char* site) {
  if (g_block == nullptr) fatal("a CUB block primitive called outside a kernel");
  g_block->collective = true;
  (void)block_barrier(site);
}

int syncthreads_vote(int predicate, bool count, const char* site) {
  if (g_block == nullptr) fatal("__syncthreads_or / _count called outside a kernel");
  if (predicate != 0) {
    g_block->acc_or = 1;
    ++g_block->acc_count;
  }
  const unsigned long long gen = block_barrier(site);
  return count ? g_block->result_count[gen & 1] : g_block->result_or[gen & 1];
}

std::uint64_t shuffle_bits(bool butterfly, unsigned mask, std::uint64_t bits, int arg, int width,
                           const char* site) {
  return warp_exchange(mask, bits, butterfly, arg, width, site);
}

long long clock() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool check_launch(dim3 grid, dim3 block, std::size_t smem) {
  const unsigned long long threads = 1ull * block.x * block.y * block.z;
  const bool ok = grid.x >= 1 && grid.y >= 1 && grid.z >= 1 && grid.y <= 65535 && grid.z <= 65535 &&
                  block.x >= 1 && block.y >= 1 && block.z >= 1 && block.x <= 1024 &&
                  block.y <= 1024 && block.z <= 64 && threads <= 1024;
  cudaError_t e = cudaSuccess;
  if (!ok) e = cudaErrorInvalidConfiguration;
  else if (smem > 48 * 1024) e = cudaErrorInvalidValue;  // more needs cudaFuncSetAttribute
  if (e == cudaSuccess) return true;
  if (g_capture) g_capture->invalidated = true;
  set_error(e);
  return false;
}

void enqueue(cudaStream_t stream, std::function<void()> op) {
  if (stream_capturing(stream)) {
    g_capture->ops.push_back(std::move(op));
    stream->clock[stream] = g_capture->ops.size();
    return;
  }
  if (legacy_conflicts_with_capture(stream)) {
    (void)refuse_during_capture(cudaErrorStreamCaptureImplicit);
    return;
  }
  if (is_special(stream)) {  // the legacy stream waits for every stream (it over-waits for
    drain_all();             // non-blocking ones), and runs now
    op();
    return;
  }
  stream->queue.push_back(stream_op{std::move(op)});
}

void run_grid(dim3 grid, dim3 block, std::size_t smem, const std::function<void()>& body) {
  if (g_block != nullptr) fatal("a kernel launched from inside a kernel");
  const unsigned count = block.x * block.y * block.z;
  if (g_fibers.size() < count) g_fibers.resize(count);
  block_run b;
  b.body = &body;
  b.fibers = &g_fibers;
  b.count = count;
  b.warps.resize((count + 31) / 32);
  b.dynamic.assign(std::max<std::size_t>(smem, 16), 0xff);  // poisoned: unset floats are NaN
  block_scope scope(&b);
  order_setting& ord = order();
  std::vector<unsigned> sequence(count);
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        b.live = count;
        b.arrived = 0;
        b.site = nullptr;
        b.collective = false;
        b.acc_or = b.acc_count = 0;
        for (unsigned w = 0; w < b.warps.size(); ++w) {
          b.warps[w] = warp_state{};
          const unsigned n = std::min(32u, count - 32 * w);
          b.warps[w].lanes = n == 32 ? 0xffffffffu : (1u << n) - 1u;
        }
        std::fill(b.dynamic.begin(), b.dynamic.end(), static_cast<unsigned char>(0xff));
        for (unsigned t = 0; t < count; ++t) {
          fiber& f = g_fibers[t];
          f.done = false;
          f.warp_ops = 0;
          f.linear = t;
          f.state.thread_idx = uint3{t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
          f.state.block_idx = uint3{bx, by, bz};
          f.state.block_dim = block;
          f.state.grid_dim = grid;
          start_fiber(f, b);
        }
        std::iota(sequence.begin(), sequence.end(), 0u);
        if (ord.kind == order_kind::reverse) std::reverse(sequence.begin(), sequence.end());
        for (;;) {
          if (ord.kind == order_kind::shuffle) std::shuffle(sequence.begin(), sequence.end(), ord.rng);
          bool any = false;
          const unsigned long long before = b.progress;
          for (const unsigned t : sequence) {
            fiber& f = g_fibers[t];
            if (f.done) continue;
            any = true;
            resume(f);
          }
          if (!any) break;
          if (b.progress == before) {
            fatal("deadlock in block (" + std::to_string(bx) + ", " + std::to_string(by) + ", " +
                  std::to_string(bz) + "): " + std::to_string(b.arrived) + " of " +
                  std::to_string(b.live) +
                  " running threads wait at a barrier, the others at a shuffle that cannot complete");
          }
        }
      }
}

}  // namespace kvscout_simt::detail

// ---- the CUDA runtime subset ----------------------------------------------------------------------
using namespace kvscout_simt::detail;

namespace {
// An asynchronous call's status: the capture it invalidated, or one invalidated before it.
cudaError_t async_status(cudaStream_t s, bool invalid_before) {
  if (!g_capture || !g_capture->invalidated) return cudaSuccess;
  if (!invalid_before) return cudaErrorStreamCaptureImplicit;  // this call invalidated it
  return stream_capturing(s) ? set_error(cudaErrorStreamCaptureInvalidated) : cudaSuccess;
}
// Pageable host memory (not from cudaHostAlloc / cudaMalloc): CUDA stages a pageable source
// before the call returns, and returns from a copy into pageable memory only once it is done.
bool pageable(const void* p) { return find_allocation(p) == nullptr; }
}  // namespace

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return set_error(cudaErrorInvalidValue);
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return set_error(cudaErrorInvalidValue);
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (value == nullptr || device != 0) return set_error(cudaErrorInvalidValue);
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = 132; break;  // an H100 / H200
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = 48 * 1024; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrCanMapHostMemory: *value = 1; break;
    case cudaDevAttrUnifiedAddressing: *value = 1; break;
    default: *value = 0; break;
  }
  return cudaSuccess;
}
cudaError_t cudaGetLastError(void) {
  const cudaError_t e = g_last_error;
  g_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) { return g_last_error; }

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureUnjoined: return "cudaErrorStreamCaptureUnjoined";
    case cudaErrorCapturedEvent: return "cudaErrorCapturedEvent";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    default: return "cudaError (simt)";
  }
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorStreamCaptureImplicit:
      return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureUnjoined: return "capture sequence contains a fork that was not joined to the primary stream";
    case cudaErrorCapturedEvent: return "operation not permitted on an event last recorded in a capturing stream";
    default: return cudaGetErrorName(e);
  }
}

cudaError_t cudaDeviceSynchronize(void) {
  if (g_capture) return refuse_during_capture(cudaErrorStreamCaptureUnsupported);
  drain_all();
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (p == nullptr) return set_error(cudaErrorInvalidValue);
  if (unsafe_refused()) return refuse_during_capture(cudaErrorStreamCaptureUnsupported);
  *p = allocate(bytes, memory_kind::device);
  return *p != nullptr ? cudaSuccess : set_error(cudaErrorMemoryAllocation);
}
cudaError_t cudaFree(void* p) {
  if (unsafe_refused()) return refuse_during_capture(cudaErrorStreamCaptureUnsupported);
  drain_all();  // cudaFree waits for the device
  return release(p, false);
}
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int flags) {
  if (p == nullptr) return set_error(cudaErrorInvalidValue);
  if (unsafe_refused()) return refuse_during_capture(cudaErrorStreamCaptureUnsupported);
  *p = allocate(bytes, (flags & cudaHostAllocMapped) ? memory_kind::host_mapped : memory_kind::host);
  return *p != nullptr ? cudaSuccess : set_error(cudaErrorMemoryAllocation);
}
cudaError_t cudaFreeHost(void* p) {
  if (unsafe_refused()) return refuse_during_capture(cudaErrorStreamCaptureUnsupported);
  drain_all();
  return release(p, true);
}
cudaError_t cudaHostGetDevicePointer(void** device, void* host, unsigned int flags) {
  if (device == nullptr || flags != 0) return set_error(cudaErrorInvalidValue);
  const auto* a = find_allocation(host);
  if (a == nullptr || a->second.kind != memory_kind::host_mapped) return set_error(cudaErrorInvalidValue);
  *device = host;
  return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* p) {
  if (attr == nullptr) return set_error(cudaErrorInvalidValue);
  *attr = cudaPointerAttributes{};
  const auto* a = find_allocation(p);
  if (a == nullptr) {
    attr->type = cudaMemoryTypeUnregistered;
    attr->hostPointer = const_cast<void*>(p);
    return cudaSuccess;
  }
  attr->device = 0;
  if (a->second.kind == memory_kind::device) {
    attr->type = cudaMemoryTypeDevice;
    attr->devicePointer = const_cast<void*>(p);
  } else {
    attr->type = cudaMemoryTypeHost;
    attr->hostPointer = const_cast<void*>(p);
    attr->devicePointer = a->second.kind == memory_kind::host_mapped ? const_cast<void*>(p) : nullptr;
  }
  return cudaSuccess;
}

// The synchronous copies and fills run on the legacy stream and wait for it.
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  if (unsafe_refused()) return refuse_during_capture(cudaErrorStreamCaptureUnsupported);
  if (bytes > 0 && (dst == nullptr || src == nullptr)) return set_error(cudaErrorInvalidValue);
  drain_all();
  if (bytes > 0) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  if (unsafe_refused()) return refuse_during_capture(cudaErrorStreamCaptureUnsupported);
  if (bytes > 0 && dst == nullptr) return set_error(cudaErrorInvalidValue);
  drain_all();
  if (bytes > 0) std::memset(dst, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t s) {
  if (bytes > 0 && (dst == nullptr || src == nullptr)) return set_error(cudaErrorInvalidValue);
  const bool before = g_capture && g_capture->invalidated;
  if (bytes > 0 && pageable(src) && !stream_capturing(s)) {
    auto staged = std::make_shared<std::vector<unsigned char>>(
        static_cast<const unsigned char*>(src), static_cast<const unsigned char*>(src) + bytes);
    enqueue(s, [=] { std::memcpy(dst, staged->data(), bytes); });
  } else {
    enqueue(s, [=] {
      if (bytes > 0) std::memmove(dst, src, bytes);
    });
  }
  if (bytes > 0 && pageable(dst) && !is_special(s) && !stream_capturing(s))
    drain_until([s] { return s->queue.empty(); });
  return async_status(s, before);
}
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t s) {
  if (bytes > 0 && dst == nullptr) return set_error(cudaErrorInvalidValue);
  const bool before = g_capture && g_capture->invalidated;
  enqueue(s, [=] {
    if (bytes > 0) std::memset(dst, value, bytes);
  });
  return async_status(s, before);
}
cudaError_t cudaMemcpyBatchAsync(void* const* dsts, const void* const* srcs, const size_t* sizes,
                                 size_t count, cudaMemcpyAttributes* attrs, size_t* attr_idxs,
                                 size_t num_attrs, cudaStream_t s) {
  if (count == 0 || dsts == nullptr || srcs == nullptr || sizes == nullptr || attrs == nullptr ||
      attr_idxs == nullptr || num_attrs == 0 || num_attrs > count || attr_idxs[0] != 0)
    return set_error(cudaErrorInvalidValue);
  if (is_legacy(s)) return set_error(cudaErrorInvalidValue);
  for (size_t a = 1; a < num_attrs; ++a)
    if (attr_idxs[a] <= attr_idxs[a - 1] || attr_idxs[a] >= count) return set_error(cudaErrorInvalidValue);
  for (size_t a = 0; a < num_attrs; ++a)
    if (attrs[a].srcAccessOrder == cudaMemcpySrcAccessOrderInvalid) return set_error(cudaErrorInvalidValue);
  std::vector<void*> d(dsts, dsts + count);
  std::vector<const void*> sr(srcs, srcs + count);
  std::vector<size_t> n(sizes, sizes + count);
  for (size_t i = 0; i < count; ++i)
    if (n[i] > 0 && (pageable(sr[i]) || pageable(d[i])))
      return set_error(cudaErrorInvalidValue);  // kvscout batches pinned / device memory only
  const bool before = g_capture && g_capture->invalidated;
  enqueue(s, [d = std::move(d), sr = std::move(sr), n = std::move(n)] {
    for (size_t i = 0; i < n.size(); ++i)
      if (n[i] > 0) std::memmove(d[i], sr[i], n[i]);
  });
  return async_status(s, before);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  if (s == nullptr) return set_error(cudaErrorInvalidValue);
  *s = new CUstream_st{};
  (*s)->id = ++g_stream_ids;
  (*s)->non_blocking = (flags & cudaStreamNonBlocking) != 0;
  g_streams.push_back(*s);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (is_special(s)) return set_error(cudaErrorInvalidValue);
  drain_until([s] { return s->queue.empty(); });  // its work still completes
  g_streams.erase(std::find(g_streams.begin(), g_streams.end(), s));
  delete s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (stream_capturing(s)) return refuse_during_capture(cudaErrorStreamCaptureUnsupported);
  if (legacy_conflicts_with_capture(s)) return refuse_during_capture(cudaErrorStreamCaptureImplicit);
  if (is_special(s)) drain_all();
  else drain_until([s] { return s->queue.empty(); });
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  if (e == nullptr) return set_error(cudaErrorInvalidValue);
  *e = new CUevent_st{};
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) { return cudaEventCreate(e); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (e == nullptr) return set_error(cudaErrorInvalidValue);
  drain_all();  // queued records and waits name it
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (e == nullptr) return set_error(cudaErrorInvalidValue);
  if (stream_capturing(s)) {
    e->captured_in = g_capture->id;
    e->clock = s->clock;
    return cudaSuccess;
  }
  if (legacy_conflicts_with_capture(s)) return refuse_during_capture(cudaErrorStreamCaptureImplicit);
  e->captured_in = 0;
  e->clock.clear();
  const unsigned long long generation = ++e->recorded;
  if (is_special(s)) {
    drain_all();
    e->completed = generation;
    e->at = std::chrono::steady_clock::now();
  } else {
    s->queue.push_back(stream_op{{}, e, nullptr, generation});
  }
  return cudaSuccess;
}
// A query runs what the record waits for and reports it done (so a polling loop ends).
cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (e == nullptr) return set_error(cudaErrorInvalidValue);
  if (g_capture && e->captured_in == g_capture->id) return set_error(cudaErrorCapturedEvent);
  drain_until([e] { return e->completed >= e->recorded; });
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) { return cudaEventQuery(e); }
// The host time between the two records' runs: emulated work, not a device's speed, but never
// zero, so a benchmark's manual timing terminates.
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  if (ms == nullptr || a == nullptr || b == nullptr) return set_error(cudaErrorInvalidValue);
  if (a->completed == 0 || b->completed == 0) return set_error(cudaErrorInvalidResourceHandle);
  *ms = std::max(1e-6f, std::chrono::duration<float, std::milli>(b->at - a->at).count());
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
  if (e == nullptr) return set_error(cudaErrorInvalidValue);
  // A stream that waits on an event recorded inside the capture joins the capture, and from then
  // on knows everything the recording stream knew.
  if (g_capture && e->captured_in == g_capture->id && !is_special(s)) {
    if (!s->capturing) {
      s->capturing = true;
      s->clock.clear();
      g_capture->streams.push_back(s);
      g_capture->all_non_blocking = g_capture->all_non_blocking && s->non_blocking;
    }
    merge(s->clock, e->clock);
    return cudaSuccess;
  }
  if (e->recorded == 0 || stream_capturing(s)) return cudaSuccess;  // nothing to wait for
  if (is_special(s)) {
    drain_until([e, g = e->recorded] { return e->completed >= g; });
  } else {
    s->queue.push_back(stream_op{{}, nullptr, e, e->recorded});
  }
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
  if (is_special(s)) return set_error(cudaErrorStreamCaptureUnsupported);
  if (g_capture) return set_error(cudaErrorIllegalState);
  g_capture = std::make_unique<capture_state>();
  g_capture->id = ++g_capture_ids;
  g_capture->origin = s;
  g_capture->mode = mode;
  g_capture->all_non_blocking = s->non_blocking;
  s->capturing = true;
  s->clock.clear();
  g_capture->streams.push_back(s);
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  if (graph == nullptr) return set_error(cudaErrorInvalidValue);
  if (!g_capture || g_capture->origin != s) return set_error(cudaErrorIllegalState);
  // Every forked stream's last operation must be joined back into the origin stream, directly
  // or through other streams' waits.
  bool unjoined = false;
  for (CUstream_st* c : g_capture->streams) {
    if (c == s) continue;
    // A stream's own entry in its clock is where its last operation lies.
    const auto last = c->clock.find(c);
    const auto seen = s->clock.find(c);
    if (last != c->clock.end() && (seen == s->clock.end() || seen->second < last->second))
      unjoined = true;
  }
  for (CUstream_st* c : g_capture->streams) {
    c->capturing = false;
    c->clock.clear();
  }
  const bool bad = g_capture->invalidated;
  auto g = std::make_unique<CUgraph_st>();
  g->ops = std::move(g_capture->ops);
  g_capture.reset();
  if (bad || unjoined) {
    *graph = nullptr;
    return set_error(bad ? cudaErrorStreamCaptureInvalidated : cudaErrorStreamCaptureUnjoined);
  }
  *graph = g.release();
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (exec == nullptr || graph == nullptr) return set_error(cudaErrorInvalidValue);
  *exec = new CUgraphExec_st{graph->ops};
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  if (exec == nullptr) return set_error(cudaErrorInvalidValue);
  for (const auto& op : exec->ops) enqueue(s, op);
  return cudaSuccess;
}
// Uploading prepares the device for a later launch: nothing to do here but check the handle.
cudaError_t cudaGraphUpload(cudaGraphExec_t exec, cudaStream_t) {
  if (exec == nullptr) return set_error(cudaErrorInvalidValue);
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}

}  // extern "C"
