// InputBuffer: the connection's unparsed bytes, without sockets.
#include "store/server/input_buffer.h"

#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <string_view>

using tcpstore::server::InputBuffer;

namespace {
std::string_view live(InputBuffer& b) { return {b.data(), b.size()}; }
}  // namespace

TEST_CASE("input buffer: append, consume and trim keep the live bytes") {
  InputBuffer b;
  CHECK(b.empty());
  CHECK(b.capacity() == 0);
  b.append("hello world", 11);
  CHECK(live(b) == "hello world");
  CHECK(b.capacity() == InputBuffer::kMinCapacity);
  b.consume(6);
  CHECK(live(b) == "world");
  b.trim();  // consumed front under half: stays in place
  CHECK(live(b) == "world");
  b.consume(5);
  CHECK(b.empty());
  b.trim();  // empty: rewinds, a small buffer is kept
  CHECK(b.capacity() == InputBuffer::kMinCapacity);
  CHECK(b.freeTail() == InputBuffer::kMinCapacity);
}

TEST_CASE("input buffer: reserveTail compacts before it grows") {
  InputBuffer b;
  std::string chunk(200, 'x');
  b.append(chunk.data(), chunk.size());
  b.consume(150);  // 50 live bytes at offset 150 of 256
  const char* before = b.data();
  char* tail = b.reserveTail(150);  // fits once compacted
  CHECK(b.capacity() == InputBuffer::kMinCapacity);
  CHECK(b.data() != before);
  CHECK(b.freeTail() >= 150);
  CHECK(live(b) == std::string(50, 'x'));
  std::string more(150, 'y');
  std::copy(more.begin(), more.end(), tail);
  b.commit(150);
  CHECK(live(b) == std::string(50, 'x') + more);
  b.reserveTail(1000);  // must grow, keeping the bytes
  CHECK(b.capacity() >= 1200);
  CHECK(live(b) == std::string(50, 'x') + more);
}

TEST_CASE("input buffer: trim moves a tail past half to the front") {
  InputBuffer b;
  std::string s(256, 'a');
  s[200] = 'b';
  b.append(s.data(), s.size());
  b.consume(200);
  b.trim();
  CHECK(b.size() == 56);
  CHECK(b.data()[0] == 'b');
  CHECK(b.freeTail() == 200);
}

TEST_CASE("input buffer: a large buffer is released once empty") {
  InputBuffer b;
  std::string big(InputBuffer::kKeepBytes + 1, 'z');
  b.append(big.data(), big.size());
  CHECK(b.capacity() > InputBuffer::kKeepBytes);
  b.consume(big.size());
  b.trim();
  CHECK(b.capacity() == 0);
  b.append("x", 1);  // usable again
  CHECK(live(b) == "x");
}

TEST_CASE("input buffer: growing keeps the live bytes after a consumed front") {
  InputBuffer b;
  std::string bytes;
  for (int i = 0; i < 300; ++i)
    bytes.push_back(static_cast<char>('a' + i % 26));
  b.append(bytes.data(), bytes.size());  // 512 bytes of capacity
  b.consume(100);                        // 200 live bytes at offset 100
  b.reserveTail(4 * 1024 * 1024);        // grows (realloc): bytes kept
  CHECK(b.capacity() >= 200 + 4 * 1024 * 1024);
  CHECK(live(b) == std::string_view(bytes).substr(100));
  // Grown again from a large block (mremap when it is mapped): still kept.
  std::memset(b.reserveTail(1), 'z', 1);
  b.commit(1);
  b.reserveTail(b.capacity());
  CHECK(live(b) == std::string(bytes.substr(100)) + "z");
}

TEST_CASE("input buffer: takeStorage hands over the block and empties it") {
  InputBuffer b;
  b.append("abc", 3);
  InputBuffer::Storage s = b.takeStorage();
  CHECK(s != nullptr);
  CHECK(std::string_view(s.get(), 3) == "abc");
  CHECK(b.empty());
  CHECK(b.capacity() == 0);
  b.append("de", 2);  // usable again
  CHECK(live(b) == "de");
}
