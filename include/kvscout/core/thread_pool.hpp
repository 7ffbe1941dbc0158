#pragma once
// A fixed pool of host threads for fork-join work in the decode loop, started once at
// construction. run() hands the same callable to every thread, the caller included, and returns
// when all have finished; it allocates nothing and takes no lock while the work runs.

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "kvscout/core/error.hpp"

namespace kvscout {

class thread_pool {
 public:
  /// `threads` counts the caller: threads - 1 workers are started.
  explicit thread_pool(int threads) : threads_(threads) {
    KVSCOUT_EXPECTS(threads >= 1 && threads <= 1024, "threads must be in [1, 1024], got ",
                    threads);
    workers_.reserve(static_cast<std::size_t>(threads - 1));
    try {
      for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker(i); });
    } catch (...) {  // a thread that could not start: stop and join the ones that did
      stop();
      throw;
    }
  }

  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  ~thread_pool() { stop(); }

  [[nodiscard]] int size() const noexcept { return threads_; }

  /// Calls f(part, size()) once for every part in [0, size()); part 0 runs on the caller. f must
  /// not throw (checked at compile time).
  template <class F>
  void run(F&& f) {
    static_assert(std::is_nothrow_invocable_v<std::remove_reference_t<F>&, int, int>,
                  "thread_pool::run needs a noexcept callable: void(int part, int parts) noexcept");
    if (threads_ == 1) {
      f(0, 1);
      return;
    }
    {
      std::lock_guard lock(mutex_);
      ctx_ = static_cast<void*>(&f);
      call_ = [](void* ctx, int part, int parts) {
        (*static_cast<std::remove_reference_t<F>*>(ctx))(part, parts);
      };
      pending_ = threads_ - 1;
      ++generation_;
    }
    wake_.notify_all();
    f(0, threads_);
    std::unique_lock lock(mutex_);
    done_.wait(lock, [this] { return pending_ == 0; });
  }

 private:
  void stop() noexcept {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
      ++generation_;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
  }
  void worker(int part) {
    std::uint64_t seen = 0;
    for (;;) {
      void* ctx;
      void (*call)(void*, int, int);
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        if (stop_) return;
        ctx = ctx_;
        call = call_;
      }
      call(ctx, part, threads_);
      bool last;
      {
        std::lock_guard lock(mutex_);
        last = --pending_ == 0;
      }
      if (last) done_.notify_one();
    }
  }

  int threads_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  void* ctx_ = nullptr;
  void (*call_)(void*, int, int) = nullptr;
};

}  // namespace kvscout
