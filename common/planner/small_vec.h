// A short vector of trivially copyable values held inline up to N elements, on the heap
// beyond. TensorEntry holds its shape and shard in these (N = 2: every weight of the supported
// models) and its view's dims (N = 1: empty for all but engine layouts), so that an entry
// without a view costs no heap allocation: Kimi-K2 layouts have 14 M entries. It offers the
// std::vector subset the planner's callers use, and converts to and from std::vector.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <type_traits>
#include <utility>
#include <vector>

namespace wb::planner {

template <class T, size_t N = 4>
class SmallVec {
  static_assert(std::is_trivially_copyable_v<T>, "SmallVec copies elements with memcpy");

 public:
  using value_type = T;
  using size_type = size_t;
  using iterator = T*;
  using const_iterator = const T*;

  SmallVec() = default;
  SmallVec(std::initializer_list<T> init) { assign(init.begin(), init.end()); }
  // Implicit, so that call sites assigning a std::vector compile unchanged.
  SmallVec(const std::vector<T>& v) { assign(v.begin(), v.end()); }
  template <class It, class = decltype(*std::declval<It>())>
  SmallVec(It first, It last) {
    assign(first, last);
  }
  SmallVec(const SmallVec& o) { assign(o.begin(), o.end()); }
  SmallVec(SmallVec&& o) noexcept { Steal(&o); }
  SmallVec& operator=(const SmallVec& o) {
    if (this != &o) assign(o.begin(), o.end());
    return *this;
  }
  SmallVec& operator=(SmallVec&& o) noexcept {
    if (this != &o) {
      Free();
      Steal(&o);
    }
    return *this;
  }
  ~SmallVec() { Free(); }
  // Implicit, for callers that keep dimensions in std::vectors.
  operator std::vector<T>() const { return std::vector<T>(begin(), end()); }  // NOLINT

  template <class It>
  void assign(It first, It last) {
    const size_t n = static_cast<size_t>(std::distance(first, last));
    size_ = 0;
    reserve(n);
    std::copy(first, last, data());
    size_ = static_cast<uint32_t>(n);
  }
  void assign(size_t n, const T& value) {
    size_ = 0;
    reserve(n);
    std::fill_n(data(), n, value);
    size_ = static_cast<uint32_t>(n);
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T* data() { return cap_ > N ? u_.heap_ : u_.inline_; }
  const T* data() const { return cap_ > N ? u_.heap_ : u_.inline_; }
  T* begin() { return data(); }
  T* end() { return data() + size_; }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size_; }
  T& operator[](size_t i) { return data()[i]; }
  const T& operator[](size_t i) const { return data()[i]; }
  T& front() { return data()[0]; }
  const T& front() const { return data()[0]; }
  T& back() { return data()[size_ - 1]; }
  const T& back() const { return data()[size_ - 1]; }

  void clear() { size_ = 0; }
  void reserve(size_t n) {
    if (n <= cap_) return;
    T* grown = new T[n];
    std::memcpy(static_cast<void*>(grown), data(), size_ * sizeof(T));
    Free();
    u_.heap_ = grown;
    cap_ = static_cast<uint32_t>(n);
  }
  void push_back(const T& v) {
    if (size_ == cap_) {
      const T copy = v;  // v may live in this vector
      reserve(2 * static_cast<size_t>(cap_));
      data()[size_++] = copy;
      return;
    }
    data()[size_++] = v;
  }
  void pop_back() { --size_; }
  void resize(size_t n, const T& value = T{}) {
    reserve(n);
    if (n > size_) std::fill(data() + size_, data() + n, value);
    size_ = static_cast<uint32_t>(n);
  }

  friend bool operator==(const SmallVec& a, const SmallVec& b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
  }
  friend bool operator!=(const SmallVec& a, const SmallVec& b) { return !(a == b); }
  friend bool operator<(const SmallVec& a, const SmallVec& b) {
    return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  void Free() {
    if (cap_ > N) delete[] u_.heap_;
    cap_ = N;
  }
  // Takes o's elements (its heap block, or a copy of its inline ones) and leaves o empty.
  void Steal(SmallVec* o) {
    if (o->cap_ > N) {
      u_.heap_ = o->u_.heap_;
      cap_ = o->cap_;
      o->cap_ = N;
    } else {
      std::memcpy(static_cast<void*>(u_.inline_), o->u_.inline_, o->size_ * sizeof(T));
      cap_ = N;
    }
    size_ = o->size_;
    o->size_ = 0;
  }

  uint32_t size_ = 0;
  uint32_t cap_ = N;  // > N: the elements are on the heap
  union Storage {
    Storage() {}  // elements are written before they are read
    T inline_[N];
    T* heap_;
  } u_;
};

}  // namespace wb::planner
