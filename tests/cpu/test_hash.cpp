#include "cuda_agent/core/hash.h"

#include <string>

#include <gtest/gtest.h>

namespace cuda_agent {
namespace {

// Test vectors from NIST FIPS 180-4 examples / the NIST CAVP short messages.
TEST(Sha256, EmptyString) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(Sha256, Abc) {
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Sha256, TwoBlockMessage448Bits) {
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256, Message896Bits) {
  EXPECT_EQ(sha256_hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmno"
                       "ijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu"),
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
}

TEST(Sha256, MillionAIncremental) {
  Sha256 hasher;
  const std::string chunk(1000, 'a');
  for (int i = 0; i < 1000; ++i) hasher.update(chunk);
  EXPECT_EQ(hasher.hex_digest(),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')), hasher.hex_digest());
}

TEST(Sha256, IncrementalMatchesOneShotAtEverySplit) {
  // Lengths around the 55/56/64-byte padding boundaries and several blocks.
  std::string message;
  for (int i = 0; i < 200; ++i) message.push_back(static_cast<char>((i * 37 + 11) & 0xff));
  for (size_t length : {0, 1, 55, 56, 57, 63, 64, 65, 119, 120, 128, 200}) {
    const std::string_view data(message.data(), length);
    const std::string expected = sha256_hex(data);
    for (size_t split = 0; split <= length; ++split) {
      Sha256 hasher;
      hasher.update(data.substr(0, split));
      hasher.update(data.substr(split));
      ASSERT_EQ(hasher.hex_digest(), expected) << "length " << length << " split " << split;
    }
    Sha256 bytewise;
    for (char c : data) bytewise.update(std::string_view(&c, 1));
    EXPECT_EQ(bytewise.hex_digest(), expected) << "length " << length;
  }
}

TEST(Sha256, DigestDoesNotFinalize) {
  Sha256 hasher;
  hasher.update("ab");
  EXPECT_EQ(hasher.hex_digest(), sha256_hex("ab"));
  hasher.update("c");
  EXPECT_EQ(hasher.hex_digest(), sha256_hex("abc"));
  EXPECT_EQ(hasher.hex_digest(), sha256_hex("abc"));
}

TEST(Sha256, BinaryData) {
  const std::string zeros(3, '\0');
  EXPECT_EQ(sha256_hex(zeros), "709e80c88487a2411e1ee4dfb9f22a861492d20c4765150c0c794abd70f8147c");
}

// RFC 4231 test cases 1, 2 and 6 (a key longer than the block).
TEST(HmacSha256, Rfc4231Vectors) {
  EXPECT_EQ(hmac_sha256_hex(std::string(20, '\x0b'), "Hi There"),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(hmac_sha256_hex("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(hmac_sha256_hex(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First"),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(HmacSha256, DigestMatchesHexAndCompareIsExact) {
  EXPECT_EQ(to_hex(hmac_sha256("k", "m")), hmac_sha256_hex("k", "m"));
  EXPECT_TRUE(constant_time_equal("abc", "abc"));
  EXPECT_FALSE(constant_time_equal("abc", "abd"));
  EXPECT_FALSE(constant_time_equal("abc", "ab"));
}

TEST(RandomBytes, AreFreshAndOfTheAskedLength) {
  const std::string a = random_hex(16), b = random_hex(16);
  EXPECT_EQ(a.size(), 32u);
  EXPECT_NE(a, b);
  EXPECT_EQ(random_bytes(7).size(), 7u);
}

}  // namespace
}  // namespace cuda_agent
