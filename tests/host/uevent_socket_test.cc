// The uevent parser against messages as the kernel formats them, and the socket against the real
// kernel.
#include "edgeaccel/host/uevent_socket.h"

#include <linux/netlink.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <string>

#include "absl/time/clock.h"
#include "fixture_host.h"

namespace edgeaccel {
namespace {

TEST(UeventTest, ParsesAKernelMessage) {
  // An Edge TPU's class device, as the apex driver's device_create announces it.
  std::optional<Uevent> event = ParseUevent(testing::NulTerminated(
      {"add@/devices/pci0000:00/0000:00:1c.0/0000:03:00.0/apex/apex_0", "ACTION=add",
       "DEVPATH=/devices/pci0000:00/0000:00:1c.0/0000:03:00.0/apex/apex_0", "SUBSYSTEM=apex",
       "MAJOR=120", "MINOR=0", "DEVNAME=apex_0", "SEQNUM=2231"}));
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(event->action, "add");
  EXPECT_EQ(event->subsystem, "apex");
  EXPECT_EQ(event->devname, "apex_0");
  EXPECT_EQ(event->devpath, "/devices/pci0000:00/0000:00:1c.0/0000:03:00.0/apex/apex_0");
}

TEST(UeventTest, RejectsWhatTheKernelDoesNotSend) {
  EXPECT_FALSE(ParseUevent("").has_value());
  EXPECT_FALSE(ParseUevent(testing::NulTerminated({"libudev", "ACTION=add", "SUBSYSTEM=usb"})).has_value());
  EXPECT_FALSE(ParseUevent(testing::NulTerminated({"add@/devices/x"})).has_value());  // no subsystem
  EXPECT_FALSE(ParseUevent("add@/devices/x").has_value());             // no NUL at all
  EXPECT_FALSE(ParseUevent(testing::NulTerminated({"@/devices/x", "SUBSYSTEM=usb"})).has_value());
  EXPECT_FALSE(
      ParseUevent(testing::NulTerminated({"add@/devices/x", "ACTION=remove", "SUBSYSTEM=usb"})).has_value());
}

TEST(UeventTest, ReceivesTheKernelsOwnAnnouncements) {
  UeventSocket socket;
  if (absl::Status opened = socket.Open(); !opened.ok()) GTEST_SKIP() << opened;
  absl::StatusOr<std::string> name = testing::AnnounceLoopDevice();
  if (!name.ok()) GTEST_SKIP() << name.status();
  bool added = false, removed = false, lost = false;
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (!(added && removed) && absl::Now() < deadline) {
    struct pollfd pfd = {socket.fd(), POLLIN, 0};
    poll(&pfd, 1, 100);
    for (const Uevent& event : socket.Drain(&lost)) {
      if (event.subsystem != "block" || event.devname != *name) continue;
      added |= event.action == "add";
      removed |= event.action == "remove";
    }
  }
  EXPECT_TRUE(added);
  EXPECT_TRUE(removed);
  EXPECT_FALSE(lost);
}

TEST(UeventTest, MessagesFromProcessesAreIgnored) {
  UeventSocket socket;
  if (absl::Status opened = socket.Open(); !opened.ok()) GTEST_SKIP() << opened;
  // Another process's netlink socket sends a forged "kernel" message straight to ours.
  int forger = ::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_KOBJECT_UEVENT);
  ASSERT_GE(forger, 0);
  struct sockaddr_nl self = {};
  socklen_t length = sizeof(self);
  ASSERT_EQ(getsockname(socket.fd(), reinterpret_cast<struct sockaddr*>(&self), &length), 0);
  const std::string forged = testing::NulTerminated({"add@/devices/x", "ACTION=add", "SUBSYSTEM=apex"});
  struct sockaddr_nl to = {};
  to.nl_family = AF_NETLINK;
  to.nl_pid = self.nl_pid;
  ASSERT_GE(sendto(forger, forged.data(), forged.size(), 0, reinterpret_cast<struct sockaddr*>(&to),
                   sizeof(to)),
            0)
      << strerror(errno);
  close(forger);
  absl::SleepFor(absl::Milliseconds(50));
  bool lost = false;
  for (const Uevent& event : socket.Drain(&lost)) EXPECT_NE(event.devpath, "/devices/x");
}

}  // namespace
}  // namespace edgeaccel
