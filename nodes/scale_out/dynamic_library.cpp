#include "dynamic_library.hpp"

#include <dlfcn.h>

#include "flowfeed/error.hpp"

namespace flowfeed {

DynamicLibrary::DynamicLibrary(const char* name, int flags, const std::string& fix)
    : name_(name), handle_(dlopen(name, flags)) {
  if (!handle_) {
    const char* why = dlerror();
    throw Error("cannot load " + name_ + " (" + (why ? why : "dlopen failed") + ") " + fix);
  }
}

void* DynamicLibrary::find(const char* symbol, const std::string& why_fix) const {
  void* address = dlsym(handle_, symbol);
  if (!address) throw Error(name_ + ": symbol " + symbol + " not found " + why_fix);
  return address;
}

}  // namespace flowfeed
