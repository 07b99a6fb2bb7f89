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

// Evaluates `expr` (a StatusOr<T>); returns its Status from the enclosing
// function when it is not OK, else moves its value into `lhs`, which may
// declare a variable:
//   SNAPSERVE_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(path));
//   SNAPSERVE_ASSIGN_OR_RETURN(impl->model, LoadModel(...));
// Expands to more than one statement: not for an unbraced if/else branch.
#define SNAPSERVE_ASSIGN_OR_RETURN(lhs, expr) \
  SNAPSERVE_ASSIGN_OR_RETURN_IMPL_(SNAPSERVE_STATUS_CONCAT_(_snapserve_or_, __LINE__), lhs, expr)

// `tmp` is a name and `lhs` may be a declaration: neither can be parenthesized.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define SNAPSERVE_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                     \
  if (!tmp.ok()) return tmp.status();                    \
  lhs = std::move(tmp).value()
// NOLINTEND(bugprone-macro-parentheses)

#define SNAPSERVE_STATUS_CONCAT_(a, b) SNAPSERVE_STATUS_CONCAT_INNER_(a, b)
#define SNAPSERVE_STATUS_CONCAT_INNER_(a, b) a##b
