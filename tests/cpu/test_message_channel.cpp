// The framed channel between the judge and the candidate process: messages and descriptors
// arrive whole, MACs and sequence numbers hold once keyed, and every way the other side can
// break the channel (closing it, going silent, flooding it, writing bytes of its own, replaying
// a frame) is a ChannelError of its own kind, never a hang.
#include "cuda_agent/core/message_channel.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <cstring>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "cuda_agent/core/hash.h"

namespace cuda_agent {
namespace {

using Kind = ChannelError::Kind;

Kind kind_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ChannelError& e) {
    return e.kind();
  }
  ADD_FAILURE() << "no ChannelError";
  return Kind::kClosed;
}

TEST(MessageChannel, CarriesJsonAndDescriptors) {
  auto [a, peer] = MessageChannel::pair();
  MessageChannel b(std::move(peer));
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  a.send({{"op", "blocks"}, {"n", 2}}, {pipe_fds[1]});
  ChannelMessage m = b.receive(5);
  EXPECT_EQ(m.body["op"], "blocks");
  EXPECT_EQ(m.body["n"], 2);
  ASSERT_EQ(m.fds.size(), 1u);
  // The received descriptor is the pipe's write end: bytes written through it arrive.
  ASSERT_EQ(::write(m.fds[0].get(), "x", 1), 1);
  char c = 0;
  ASSERT_EQ(::read(pipe_fds[0], &c, 1), 1);
  EXPECT_EQ(c, 'x');
  EXPECT_NE(::fcntl(m.fds[0].get(), F_GETFD) & FD_CLOEXEC, 0) << "received descriptors are close-on-exec";
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);

  // A large frame arrives whole, after small ones, in order.
  const std::string big(3 << 20, 'q');
  std::thread sender([&] {
    a.send({{"i", 1}});
    a.send({{"big", big}});
  });
  EXPECT_EQ(b.receive(5).body["i"], 1);
  EXPECT_EQ(b.receive(5).body["big"].get<std::string>().size(), big.size());
  sender.join();
}

TEST(MessageChannel, SpinningWaitsForAFrameWithoutTakingIt) {
  auto [a, peer] = MessageChannel::pair();
  MessageChannel b(std::move(peer));
  // Nothing sent: the spin gives up after its time, having taken at least that long.
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(b.spin_until_readable(0.02));
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(20));
  // A frame sent meanwhile ends the spin; the frame is still there to receive, whole.
  std::thread sender([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    a.send({{"op", "run"}});
  });
  EXPECT_TRUE(b.spin_until_readable(5));
  sender.join();
  EXPECT_EQ(b.receive(1).body["op"], "run");
  // A closed peer ends it too (receive() then says how).
  { MessageChannel gone = std::move(a); }
  EXPECT_TRUE(b.spin_until_readable(5));
  EXPECT_EQ(kind_of([&] { b.receive(1); }), Kind::kClosed);
}

TEST(MessageChannel, KeyedFramesMustVerifyAndComeInOrder) {
  auto [a, peer] = MessageChannel::pair();
  MessageChannel b(std::move(peer));
  a.send({{"op", "hello"}});  // before the key: not authenticated
  EXPECT_EQ(b.receive(5).body["op"], "hello");
  a.set_send_key("secret");
  b.set_receive_key("secret");
  a.send({{"op", "ready"}});
  EXPECT_EQ(b.receive(5).body["op"], "ready");

  // Somebody else writing on the sender's socket (solution code in the candidate process) has
  // no key: a well-formed frame with a zero MAC does not verify.
  const std::string body = R"({"op":"ran","ms":0.001})";
  std::string forged = "CAF1";
  uint64_t seq = 3;
  forged.append(reinterpret_cast<const char*>(&seq), 8);
  uint32_t len = static_cast<uint32_t>(body.size());
  forged.append(reinterpret_cast<const char*>(&len), 4);
  forged.append(32, '\0');
  forged += body;
  ASSERT_EQ(::send(a.fd(), forged.data(), forged.size(), 0), static_cast<ssize_t>(forged.size()));
  EXPECT_EQ(kind_of([&] { b.receive(5); }), Kind::kBadMac);

  // A frame with the right MAC but an old number (a replay of a frame the harness sent) is
  // refused too: the receiver expects number 3 next.
  auto frame = [](uint64_t number, const std::string& key, const std::string& payload) {
    std::string header = "CAF1";
    header.append(reinterpret_cast<const char*>(&number), 8);
    const uint32_t length = static_cast<uint32_t>(payload.size());
    header.append(reinterpret_cast<const char*>(&length), 4);
    const auto mac = hmac_sha256(key, header.substr(4) + payload);
    header.append(reinterpret_cast<const char*>(mac.data()), mac.size());
    return header + payload;
  };
  auto [c, peer2] = MessageChannel::pair();
  MessageChannel d(std::move(peer2));
  d.set_receive_key("k");
  const std::string first = frame(1, "k", R"({"n":1})");
  ASSERT_EQ(::send(c.fd(), first.data(), first.size(), 0), static_cast<ssize_t>(first.size()));
  EXPECT_EQ(d.receive(5).body["n"], 1);
  ASSERT_EQ(::send(c.fd(), first.data(), first.size(), 0), static_cast<ssize_t>(first.size()));
  EXPECT_EQ(kind_of([&] { d.receive(5); }), Kind::kBadMac);
}

TEST(MessageChannel, EveryBrokenPeerIsAnErrorOfItsKindNeverAHang) {
  {  // silence: a timeout, in about the time asked for
    auto [a, peer] = MessageChannel::pair();
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(kind_of([&] { a.receive(0.2); }), Kind::kTimeout);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_GE(s, 0.15);
    EXPECT_LT(s, 2.0);
  }
  {  // the peer closes: closed, at once
    auto [a, peer] = MessageChannel::pair();
    { UniqueFd gone = std::move(peer); }
    EXPECT_EQ(kind_of([&] { a.receive(5); }), Kind::kClosed);
    EXPECT_EQ(kind_of([&] { a.send({{"x", 1}}); }), Kind::kClosed);
  }
  {  // bytes that are not a frame
    auto [a, peer] = MessageChannel::pair();
    const std::string junk(100, 'z');
    ASSERT_EQ(::write(peer.get(), junk.data(), junk.size()), 100);
    EXPECT_EQ(kind_of([&] { a.receive(5); }), Kind::kMalformed);
  }
  {  // a frame announcing more than the receiver takes: refused before it is read
    auto [a, peer] = MessageChannel::pair();
    MessageChannel b(std::move(peer));
    b.send({{"big", std::string(4096, 'x')}});
    EXPECT_EQ(kind_of([&] { a.receive(5, 1024); }), Kind::kTooLarge);
  }
  {  // a frame cut short, then silence: a timeout, not a hang
    auto [a, peer] = MessageChannel::pair();
    const char partial[] = {'C', 'A', 'F', '1', 1, 0};
    ASSERT_EQ(::write(peer.get(), partial, sizeof(partial)), static_cast<ssize_t>(sizeof(partial)));
    EXPECT_EQ(kind_of([&] { a.receive(0.2); }), Kind::kTimeout);
  }
  {  // a payload that is not a JSON object
    auto [a, peer] = MessageChannel::pair();
    std::string frame = "CAF1";
    uint64_t seq = 1;
    frame.append(reinterpret_cast<const char*>(&seq), 8);
    const std::string body = "[1, 2]";
    uint32_t len = static_cast<uint32_t>(body.size());
    frame.append(reinterpret_cast<const char*>(&len), 4);
    frame.append(32, '\0');
    frame += body;
    ASSERT_EQ(::write(peer.get(), frame.data(), frame.size()), static_cast<ssize_t>(frame.size()));
    EXPECT_EQ(kind_of([&] { a.receive(5); }), Kind::kMalformed);
  }
}

}  // namespace
}  // namespace cuda_agent
