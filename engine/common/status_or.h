// StatusOr<T>: a value or the Status explaining why there is none. Used by
// every fallible engine function that produces something (loaders, parsers).
#pragma once

#include <cassert>
#include <optional>
#include <utility>

#include "engine/common/status.h"

namespace snapserve {

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : value_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    assert(!status_.ok() && "StatusOr built from an OK status has no value");
  }

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace snapserve

// Returns early from the enclosing function when `expr` yields a non-OK Status.
#define SNAPSERVE_RETURN_IF_ERROR(expr)            \
  do {                                             \
    ::snapserve::Status _snapserve_st = (expr);    \
    if (!_snapserve_st.ok()) return _snapserve_st; \
  } while (0)
