// KDTR: a little-endian container of named tensors (golden vectors, traces, checkpoints).
// Header-only C++17 reader/writer with no torch dependency; the byte layout is plans/0006-kdtr.md,
// and suite/kdtr.py is the independent Python implementation tests/test_kdtr.py checks it against.
#pragma once
#include <unistd.h>  // fsync, getpid (POSIX)

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kdtr.h copies tensor bytes verbatim, so it needs a little-endian host"
#endif

namespace kdb::kdtr {

// Every malformed file or write request throws this; the message names the file and the fault.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

constexpr uint32_t kVersion = 1;
constexpr uint64_t kPreamble = 40;           // bytes before the tensor table
constexpr uint64_t kAlign = 64;              // every data offset is a multiple of this
constexpr uint64_t kMaxNdim = 32;
constexpr uint64_t kMinEntry = 4 + 1 + 16;   // name_len, dtype, ndim; 1-byte name; offset, nbytes
constexpr uint64_t kMaxBytes = INT64_MAX;    // sizes fit a signed 64-bit int (numpy intp, off_t)

struct DTypeInfo {
  const char* name;
  uint64_t itemsize;
};
// Indexed by dtype code; code 0 is reserved so a zeroed entry never reads as a valid dtype.
constexpr std::array<DTypeInfo, 14> kDTypes = {{{"", 0}, {"f16", 2}, {"bf16", 2}, {"f32", 4},
                                                {"f64", 8}, {"i8", 1}, {"i16", 2}, {"i32", 4},
                                                {"i64", 8}, {"u8", 1}, {"u16", 2}, {"u32", 4},
                                                {"u64", 8}, {"bool", 1}}};

inline const DTypeInfo* dtype_info(uint32_t code) {
  return code > 0 && code < kDTypes.size() ? &kDTypes[code] : nullptr;
}

// `where` prefixes the error, e.g. "out.kdtr: tensor 'w'".
inline uint8_t dtype_code(const std::string& name, const std::string& where) {
  std::string valid;
  for (size_t c = 1; c < kDTypes.size(); ++c) {
    if (name == kDTypes[c].name) return static_cast<uint8_t>(c);
    valid += (c > 1 ? ", " : "") + std::string(kDTypes[c].name);
  }
  throw Error(where + ": unknown dtype '" + name + "' (valid: " + valid + ")");
}

// One table entry as stored; offset and nbytes are in bytes from the start of the file.
struct Entry {
  std::string name;
  uint8_t dtype = 0;
  std::vector<uint64_t> shape;
  uint64_t offset = 0;
  uint64_t nbytes = 0;
};

// A whole file read into memory; tensor data are views into `bytes`.
struct File {
  std::string path;
  std::vector<uint8_t> bytes;
  std::vector<Entry> entries;  // in table order
  const uint8_t* data(const Entry& e) const { return bytes.data() + e.offset; }
};

// A tensor to write: `data` points at `nbytes` little-endian C-order bytes owned by the caller.
struct TensorView {
  std::string name;
  uint8_t dtype = 0;
  std::vector<uint64_t> shape;
  const void* data = nullptr;
  uint64_t nbytes = 0;
};

// CRC-32 as in zlib (reflected polynomial 0xEDB88320); pass the previous value to continue.
// Slicing-by-8 (8 tables, 8 KiB): about 2x a byte-at-a-time table, no CPU-specific instructions.
inline uint32_t crc32(const uint8_t* p, uint64_t n, uint32_t crc = 0) {
  static const std::array<std::array<uint32_t, 256>, 8> t = [] {
    std::array<std::array<uint32_t, 256>, 8> tab{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      tab[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)  // tab[k][i] = CRC of byte i followed by k zero bytes
      for (int k = 1; k < 8; ++k) tab[k][i] = tab[0][tab[k - 1][i] & 0xFF] ^ (tab[k - 1][i] >> 8);
    return tab;
  }();
  auto word = [](const uint8_t* q) {
    return uint32_t(q[0]) | uint32_t(q[1]) << 8 | uint32_t(q[2]) << 16 | uint32_t(q[3]) << 24;
  };
  crc = ~crc;
  for (; n >= 8; n -= 8, p += 8) {
    const uint32_t lo = crc ^ word(p), hi = word(p + 4);
    crc = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
          t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
  }
  for (; n > 0; --n) crc = t[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

namespace detail {

template <class T>
T load(const uint8_t* p) {  // little-endian host (checked above), so a plain copy
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <class T>
void store(std::vector<uint8_t>& out, T v) {
  const auto* b = reinterpret_cast<const uint8_t*>(&v);
  out.insert(out.end(), b, b + sizeof v);
}

inline uint64_t align_up(uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }  // x <= 2^63-1

inline std::string hex8(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

inline std::string fmt_shape(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Strict UTF-8 as Python decodes it: no overlongs, no surrogates, nothing above U+10FFFF.
inline bool valid_utf8(const std::string& s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  size_t i = 0, n = s.size();
  while (i < n) {
    uint8_t c = p[i];
    const size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3
                     : (c & 0xF8) == 0xF0 ? 4 : 0;  // 0: a continuation or invalid lead byte
    if (len == 0 || n - i < len) return false;
    uint32_t cp = len == 1 ? c : c & (0x7F >> len);
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return false;
      cp = cp << 6 | (p[i + k] & 0x3F);
    }
    static const uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

// Bytes implied by shape x itemsize; throws when any dim, or the product of the non-zero dims
// times the itemsize, exceeds 2^63-1 (so an empty tensor cannot hide an absurd dim either).
inline uint64_t shape_bytes(const std::string& where, const std::vector<uint64_t>& shape,
                            uint64_t itemsize) {
  uint64_t nonzero = itemsize;
  bool empty = false;
  for (uint64_t d : shape) {
    if (d == 0) {
      empty = true;
      continue;
    }
    if (d > kMaxBytes / nonzero)
      throw Error(where + ": shape " + fmt_shape(shape) + " holds more than 2^63-1 bytes");
    nonzero *= d;
  }
  return empty ? 0 : nonzero;
}

// The checks shared by reader and writer: name, dtype, ndim, shape and nbytes agree.
inline void check_tensor(const std::string& path, size_t index, const Entry& e,
                         std::unordered_set<std::string>& names) {
  const std::string at = path + ": tensor #" + std::to_string(index);
  if (e.name.empty()) throw Error(at + ": empty name");
  if (e.name.size() > 0xFFFF) throw Error(at + ": name longer than 65535 bytes");
  if (!valid_utf8(e.name)) throw Error(at + ": name is not valid UTF-8");
  if (e.name.find('\0') != std::string::npos)  // C strings (and error messages) would cut it short
    throw Error(at + ": name contains a NUL character");
  if (!names.insert(e.name).second) throw Error(path + ": duplicate tensor name '" + e.name + "'");
  const std::string where = path + ": tensor '" + e.name + "'";
  const DTypeInfo* dt = dtype_info(e.dtype);
  if (!dt) throw Error(where + ": unknown dtype code " + std::to_string(e.dtype));
  if (e.shape.size() > kMaxNdim)
    throw Error(where + ": ndim " + std::to_string(e.shape.size()) + " exceeds 32");
  const uint64_t want = shape_bytes(where, e.shape, dt->itemsize);
  if (e.nbytes != want)
    throw Error(where + ": nbytes " + std::to_string(e.nbytes) + " != " + std::to_string(want) +
                " implied by shape " + fmt_shape(e.shape) + " x " + std::to_string(dt->itemsize) +
                "-byte " + dt->name);
}

// Where the data may go: aligned, after the header and the previous tensor, inside the file.
inline void check_placement(const std::string& path, const Entry& e, uint64_t min_offset,
                            uint64_t file_len) {
  const std::string where = path + ": tensor '" + e.name + "'";
  const std::string off = "offset " + std::to_string(e.offset);
  if (e.offset % kAlign != 0) throw Error(where + ": " + off + " is not 64-byte aligned");
  if (e.offset < min_offset)
    throw Error(where + ": " + off + " overlaps the header or the previous tensor " +
                "(data may start at " + std::to_string(min_offset) + ")");
  if (e.nbytes > file_len || e.offset > file_len - e.nbytes)  // overflow-safe offset + nbytes > len
    throw Error(where + ": " + off + " + " + std::to_string(e.nbytes) +
                " bytes past end of file (" + std::to_string(file_len) + " bytes)");
}

// Reads one raw entry at h[pos..hlen), advancing pos; every length is checked before it is read.
inline Entry parse_entry(const std::string& path, size_t index, const uint8_t* h, uint64_t& pos,
                         uint64_t hlen) {
  const std::string past = path + ": tensor #" + std::to_string(index) + ": entry runs past the " +
                           "end of the " + std::to_string(hlen) + "-byte header";
  if (hlen - pos < 4) throw Error(past);
  const uint64_t name_len = load<uint16_t>(h + pos), ndim = h[pos + 3];
  const uint64_t need = 4 + name_len + 8 * ndim + 16;  // at most 4 + 65535 + 2040 + 16: no overflow
  if (hlen - pos < need) throw Error(past);
  Entry e;
  e.dtype = h[pos + 2];
  e.name.assign(reinterpret_cast<const char*>(h + pos + 4), name_len);
  const uint8_t* q = h + pos + 4 + name_len;
  for (uint64_t k = 0; k < ndim; ++k) e.shape.push_back(load<uint64_t>(q + 8 * k));
  e.offset = load<uint64_t>(q + 8 * ndim);
  e.nbytes = load<uint64_t>(q + 8 * ndim + 8);
  pos += need;
  return e;
}

struct Preamble {
  uint64_t header_len, file_len;
  uint32_t n_tensors, data_crc;
};

// The fixed 40 bytes alone: magic, version, flags, lengths against the real file size. Cheap, so a
// reader runs it before it reads (or allocates room for) anything past the preamble.
inline Preamble check_fixed(const std::string& path, const uint8_t* b, uint64_t size) {
  if (size < kPreamble)
    throw Error(path + ": truncated: " + std::to_string(size) +
                " bytes is shorter than the 40-byte KDTR preamble");
  if (std::memcmp(b, "KDTR", 4) != 0) {
    char got[16];
    std::snprintf(got, sizeof got, "%02x %02x %02x %02x", b[0], b[1], b[2], b[3]);
    throw Error(path + ": bad magic bytes " + got + " (expected 4b 44 54 52 = 'KDTR')");
  }
  const uint32_t version = load<uint32_t>(b + 4), flags = load<uint32_t>(b + 28);
  if (version != kVersion)
    throw Error(path + ": unsupported KDTR version " + std::to_string(version) +
                " (this reader reads version 1)");
  if (flags != 0) throw Error(path + ": nonzero reserved flags 0x" + hex8(flags));
  Preamble p{load<uint64_t>(b + 8), load<uint64_t>(b + 16), load<uint32_t>(b + 24),
             load<uint32_t>(b + 32)};
  if (p.file_len != size)
    throw Error(path + ": file is " + std::to_string(size) + " bytes but its header records " +
                std::to_string(p.file_len) + " (truncated or extended)");
  if (p.header_len < kPreamble || p.header_len > size)
    throw Error(path + ": header length " + std::to_string(p.header_len) + " outside [40, " +
                std::to_string(size) + "]");
  if (p.n_tensors > (p.header_len - kPreamble) / kMinEntry)
    throw Error(path + ": " + std::to_string(p.n_tensors) + " tensors cannot fit in a " +
                std::to_string(p.header_len) + "-byte header (each entry takes at least 21 bytes)");
  return p;
}

// `b` holds at least the header (p.header_len bytes).
inline void check_header_crc(const std::string& path, const uint8_t* b, const Preamble& p) {
  const uint32_t stored = load<uint32_t>(b + 36);
  const uint32_t crc = crc32(b + kPreamble, p.header_len - kPreamble, crc32(b, 36));
  if (crc != stored)
    throw Error(path + ": header checksum mismatch: stored crc32 " + hex8(stored) + ", computed " +
                hex8(crc));
}

inline Preamble check_preamble(const std::string& path, const uint8_t* b, uint64_t size) {
  const Preamble p = check_fixed(path, b, size);
  check_header_crc(path, b, p);
  return p;
}

// Parses and checks every table entry of a header held in `b` (header_len bytes).
inline std::vector<Entry> parse_table(const std::string& path, const uint8_t* b, const Preamble& p) {
  std::unordered_set<std::string> names;
  std::vector<Entry> entries;
  uint64_t pos = kPreamble, min_offset = p.header_len;
  for (uint32_t i = 0; i < p.n_tensors; ++i) {
    Entry e = parse_entry(path, i, b, pos, p.header_len);
    check_tensor(path, i, e, names);
    check_placement(path, e, min_offset, p.file_len);
    min_offset = e.offset + e.nbytes;  // <= file_len, checked above
    entries.push_back(std::move(e));
  }
  if (pos != p.header_len)
    throw Error(path + ": header has " + std::to_string(p.header_len - pos) +
                " unparsed trailing bytes after " + std::to_string(p.n_tensors) + " tensors");
  return entries;
}

// Grows `v` to n bytes; an allocation failure is a KDTR error naming the file, never bad_alloc.
inline void grow(const std::string& path, std::vector<uint8_t>& v, uint64_t n) {
  try {
    v.resize(static_cast<size_t>(n));
  } catch (const std::bad_alloc&) {
    throw Error(path + ": cannot allocate " + std::to_string(n) + " bytes to read it");
  } catch (const std::length_error&) {
    throw Error(path + ": " + std::to_string(n) + " bytes is more than this machine can hold");
  }
}

// C strings end at NUL: "a\0b" would silently open "a".
inline void check_path(const std::string& path) {
  if (path.find('\0') != std::string::npos)
    throw Error(path.substr(0, path.find('\0')) + "...: path contains a NUL byte");
}

// A temp file beside the target: closed and removed on error, renamed over the target by commit().
struct TempFile {
  std::string path, target;
  FILE* f = nullptr;
  TempFile(const std::string& dst) : target(dst) {
    const auto stamp = std::chrono::steady_clock::now().time_since_epoch().count();
    path = dst + ".tmp-" + std::to_string(getpid()) + "-" + std::to_string(stamp);
    f = std::fopen(path.c_str(), "wbx");  // "x": never truncate (or later remove) another's file
    if (!f) throw Error(path + ": cannot create: " + std::strerror(errno));
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (f) std::fclose(f);
    if (!path.empty()) std::remove(path.c_str());
  }
  void put(const void* p, uint64_t n, uint32_t* crc) {
    if (n && std::fwrite(p, 1, n, f) != n) fail("write");
    if (crc) *crc = crc32(static_cast<const uint8_t*>(p), n, *crc);
  }
  void commit() {  // fsync before rename, so a crash leaves the old file or the whole new one
    if (std::fflush(f) != 0 || fsync(fileno(f)) != 0) fail("flush");
    const int rc = std::fclose(f);
    f = nullptr;
    if (rc != 0) fail("close");
    if (std::rename(path.c_str(), target.c_str()) != 0) fail("rename over the target");
    path.clear();
  }
  [[noreturn]] void fail(const char* what) {
    throw Error(path + ": cannot " + what + ": " + std::strerror(errno));
  }
};

// Checks the tensors and fills `es` with the canonical layout; returns the preamble (data_crc 0).
inline Preamble plan(const std::string& path, const std::vector<TensorView>& tensors,
                     std::vector<Entry>& es) {
  std::unordered_set<std::string> names;
  uint64_t header_len = kPreamble;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorView& t = tensors[i];
    es.push_back({t.name, t.dtype, t.shape, 0, t.nbytes});
    check_tensor(path, i, es.back(), names);
    if (t.nbytes && !t.data) throw Error(path + ": tensor '" + t.name + "': null data");
    header_len += 4 + t.name.size() + 8 * t.shape.size() + 16;
  }
  if (es.size() > UINT32_MAX) throw Error(path + ": more than 2^32-1 tensors");
  uint64_t end = header_len;
  for (Entry& e : es) {
    e.offset = align_up(end);
    if (e.nbytes > kMaxBytes - e.offset) throw Error(path + ": total size exceeds 2^63-1 bytes");
    end = e.offset + e.nbytes;
  }
  return {header_len, align_up(end), static_cast<uint32_t>(es.size()), 0};
}

inline std::vector<uint8_t> encode_header(const std::vector<Entry>& es, const Preamble& p) {
  std::vector<uint8_t> h;
  h.insert(h.end(), {'K', 'D', 'T', 'R'});
  store<uint32_t>(h, kVersion);
  store<uint64_t>(h, p.header_len);
  store<uint64_t>(h, p.file_len);
  store<uint32_t>(h, p.n_tensors);
  store<uint32_t>(h, 0);  // flags
  store<uint32_t>(h, p.data_crc);
  store<uint32_t>(h, 0);  // header crc, filled below
  for (const Entry& e : es) {
    store<uint16_t>(h, static_cast<uint16_t>(e.name.size()));
    h.push_back(e.dtype);
    h.push_back(static_cast<uint8_t>(e.shape.size()));
    h.insert(h.end(), e.name.begin(), e.name.end());
    for (uint64_t d : e.shape) store<uint64_t>(h, d);
    store<uint64_t>(h, e.offset);
    store<uint64_t>(h, e.nbytes);
  }
  const uint32_t crc = crc32(h.data() + kPreamble, h.size() - kPreamble, crc32(h.data(), 36));
  std::memcpy(h.data() + 36, &crc, 4);
  return h;
}

}  // namespace detail

// Parses a whole file held in memory; `path` only labels the error messages. With verify=false
// the data checksum is skipped (the header checksum and every bound are always checked).
inline File parse(const std::string& path, std::vector<uint8_t> bytes, bool verify = true) {
  File f{path, std::move(bytes), {}};
  const uint8_t* b = f.bytes.data();
  const uint64_t size = f.bytes.size();
  const detail::Preamble p = detail::check_preamble(path, b, size);
  f.entries = detail::parse_table(path, b, p);
  const uint32_t crc = verify ? crc32(b + p.header_len, size - p.header_len) : p.data_crc;
  if (crc != p.data_crc)
    throw Error(path + ": data checksum mismatch: stored crc32 " + detail::hex8(p.data_crc) +
                ", computed " + detail::hex8(crc));
  return f;
}

// Reads in three steps, each checked before the next is read: the 40-byte preamble against the
// file's size, then the header (checksum and every entry's bounds), then the body. A file that is
// not KDTR, or whose sizes disagree, is rejected after reading 40 bytes, whatever its length.
inline File read_file(const std::string& path, bool verify = true) {
  detail::check_path(path);
  FILE* fp = std::fopen(path.c_str(), "rb");
  if (!fp) throw Error(path + ": cannot open: " + std::strerror(errno));
  struct Closer {
    FILE* f;
    ~Closer() { std::fclose(f); }
  } closer{fp};
  auto fail = [&](const char* what) {
    return Error(path + ": cannot " + what + ": " + (errno ? std::strerror(errno) : "short read"));
  };
  auto read_range = [&](std::vector<uint8_t>& v, uint64_t from, uint64_t to) {
    errno = 0;
    if (to > from && std::fread(v.data() + from, 1, to - from, fp) != to - from) throw fail("read");
  };
  errno = 0;
  if (fseeko(fp, 0, SEEK_END) != 0) throw fail("seek");
  const off_t end = ftello(fp);
  if (end < 0 || fseeko(fp, 0, SEEK_SET) != 0) throw fail("seek");
  const uint64_t size = static_cast<uint64_t>(end);
  std::vector<uint8_t> bytes;
  detail::grow(path, bytes, size < kPreamble ? size : kPreamble);
  read_range(bytes, 0, bytes.size());
  const detail::Preamble p = detail::check_fixed(path, bytes.data(), size);
  detail::grow(path, bytes, p.header_len);
  read_range(bytes, kPreamble, p.header_len);
  detail::check_header_crc(path, bytes.data(), p);
  detail::parse_table(path, bytes.data(), p);  // entry bounds against file_len before the body
  detail::grow(path, bytes, size);
  read_range(bytes, p.header_len, size);
  return parse(path, std::move(bytes), verify);
}

// Writes atomically: a temp file next to `path`, fsync, then rename over `path`. The layout is
// canonical (each blob at the next 64-byte boundary, zero padding, file length a multiple of 64),
// so this writer and suite/kdtr.py produce byte-identical files from the same tensors.
inline void write_file(const std::string& path, const std::vector<TensorView>& tensors) {
  detail::check_path(path);
  std::vector<Entry> es;
  detail::Preamble p = detail::plan(path, tensors, es);
  static const uint8_t zeros[kAlign] = {};
  detail::TempFile tmp(path);
  const std::vector<uint8_t> placeholder(p.header_len, 0);  // the real header needs the data CRC
  tmp.put(placeholder.data(), p.header_len, nullptr);
  uint64_t pos = p.header_len;
  for (size_t i = 0; i < es.size(); ++i) {
    tmp.put(zeros, es[i].offset - pos, &p.data_crc);  // < 64 bytes of padding
    tmp.put(tensors[i].data, es[i].nbytes, &p.data_crc);
    pos = es[i].offset + es[i].nbytes;
  }
  tmp.put(zeros, p.file_len - pos, &p.data_crc);
  const std::vector<uint8_t> header = detail::encode_header(es, p);
  if (std::fseek(tmp.f, 0, SEEK_SET) != 0) tmp.fail("seek");
  tmp.put(header.data(), header.size(), nullptr);
  tmp.commit();
}

}  // namespace kdb::kdtr
