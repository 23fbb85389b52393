#pragma once
// A rank's business card, exchanged at rendezvous: who it is and where to reach it.
#include <string>
#include <vector>

namespace hetobs {

struct Card {
  int rank = -1;
  int pid = 0;
  std::string host_key;  // equal only for ranks that can share memory (boot id + network namespace)
  std::string hostname;
  std::string ip;
  int port = 0;

  std::string encode() const;
  // Throws Error naming the field that is wrong.
  static Card decode(const std::string& text);
};

// This machine's key: ranks with equal keys use shared memory under HETOBS_TRANSPORT=auto.
std::string localHostKey();
std::string localHostname();
// /proc/sys/kernel/random/boot_id ("" if unreadable): a pid and its start ticks name one
// process only within one boot, so stats segments and rank files carry it.
std::string localBootId();

}  // namespace hetobs
