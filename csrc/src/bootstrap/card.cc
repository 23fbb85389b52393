#include "hetobs/bootstrap/card.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "hetobs/common/error.h"

namespace hetobs {

std::string Card::encode() const {
  std::ostringstream o;
  o << "hetobs-card-v1\n" << rank << "\n" << pid << "\n" << host_key << "\n" << hostname << "\n" << ip << "\n" << port << "\n";
  return o.str();
}

Card Card::decode(const std::string& text) {
  std::istringstream in(text);
  std::string magic;
  std::getline(in, magic);
  if (magic != "hetobs-card-v1") throw Error("rendezvous card has an unknown format ('" + magic.substr(0, 32) + "')");
  Card c;
  std::string rank, pid, port;
  std::getline(in, rank);
  std::getline(in, pid);
  std::getline(in, c.host_key);
  std::getline(in, c.hostname);
  std::getline(in, c.ip);
  std::getline(in, port);
  try {
    c.rank = std::stoi(rank);
    c.pid = std::stoi(pid);
    c.port = std::stoi(port);
  } catch (const std::exception&) {
    throw Error("rendezvous card has a malformed rank, pid or port");
  }
  if (c.ip.empty() || c.port <= 0 || c.port > 65535) throw Error("rendezvous card has no usable address");
  return c;
}

std::string localBootId() {
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  return boot;
}

std::string localHostKey() {
  std::string boot = localBootId();
  struct stat st {};
  unsigned long netns = 0;
  if (stat("/proc/self/ns/net", &st) == 0) netns = (unsigned long)st.st_ino;
  return boot + ":" + std::to_string(netns);
}

std::string localHostname() {
  char buf[256] = {0};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

}  // namespace hetobs
