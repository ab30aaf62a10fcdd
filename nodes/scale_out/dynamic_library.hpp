#pragma once
// The one resolver for libraries flowfeed loads at run time (Open MPI, NCCL): binaries link
// neither, so they start where the library is missing and fail only when a job needs it.

#include <string>

namespace flowfeed {

/// A library opened with dlopen; it stays loaded for the life of the process.
class DynamicLibrary {
 public:
  /// Opens `name` (dlopen with `flags`). Throws Error "cannot load NAME (dlerror) `fix`".
  DynamicLibrary(const char* name, int flags, const std::string& fix);

  /// Looks up `symbol` into `out` (a function or object pointer). Throws Error
  /// "NAME: symbol SYMBOL not found `why_fix`".
  template <typename T>
  void resolve(const char* symbol, T* out, const std::string& why_fix) const {
    *out = reinterpret_cast<T>(find(symbol, why_fix));
  }

 private:
  void* find(const char* symbol, const std::string& why_fix) const;
  std::string name_;
  void* handle_ = nullptr;
};

}  // namespace flowfeed
