// MemoryFence: the strict CPU device's guard over its "device memory". Outside Device calls the
// arena is PROT_NONE, so host code that reads or writes device memory directly (a mistake that on
// a GPU would read garbage or crash far from its cause) faults at once; a SIGSEGV handler names
// the address and the arena before the process dies. Device calls open the fence for their
// duration; openings nest and are counted across threads (copy workers, oneTBB, MPI), and the
// memory is closed again when the last one ends.
#pragma once
#include <cstddef>
#include <mutex>

namespace zoe {

class MemoryFence {
 public:
  // Guards [base, base + bytes) (page aligned); starts closed. bytes 0: guards nothing.
  MemoryFence(void* base, size_t bytes);
  ~MemoryFence();
  MemoryFence(const MemoryFence&) = delete;
  MemoryFence& operator=(const MemoryFence&) = delete;

  void open();
  void close();

  class Open {
   public:
    explicit Open(MemoryFence* f) : f_(f) {
      if (f_) f_->open();
    }
    ~Open() {
      if (f_) f_->close();
    }
    Open(const Open&) = delete;
    Open& operator=(const Open&) = delete;

   private:
    MemoryFence* f_;
  };

 private:
  void protect(int prot);
  char* base_;
  size_t bytes_;
  int depth_ = 0;
  std::mutex mu_;
};

}  // namespace zoe
